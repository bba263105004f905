"""Public peak TFLOPS per device and dtype, for ``perf/mfu``; which device this process trains on.

The table holds dense (no sparsity) matrix-unit peaks per chip, as published; MFU is the achieved
``perf/tflops`` over this. ``peak_tflops:`` in the config overrides the table (a 910B variant whose clock
differs, a dtype not listed). A CPU has no peak here: MFU is off, with one log line; so is an unknown device.

Example:
    >>> peak_for("ascend910b", "bfloat16")
    (320.0, 'ascend910b bfloat16')
    >>> peak_for("cpu", "float32")
    (None, 'cpu: no peak figure (MFU is off)')
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional, Tuple

log = logging.getLogger("msbridge")

#: Chip (as MindSpore's ``get_ascend_soc_version`` names it) -> dtype -> dense peak TFLOPS.
PEAK_TFLOPS: Mapping[str, Mapping[str, float]] = {
    # Ascend 910 (910A): 256 TFLOPS FP16. Huawei, "Huawei launches Ascend 910, the world's most powerful AI
    # processor", 2019-08-23, https://www.huawei.com/en/news/2019/8/huawei-ascend-910-most-powerful-ai-processor
    # (no BF16 on 910A).
    "ascend910": {"float16": 256.0},
    # Ascend 910B: about 320 TFLOPS FP16/BF16 for the common 910B (the B1-B4 bins differ: about 280 to 400),
    # as reported, e.g. https://boardor.com/blog/huawei-ascend-910b-outperforms-h20-910c-approaches-h100; Huawei
    # publishes no per-chip datasheet figure, so set peak_tflops for a specific bin.
    "ascend910b": {"float16": 320.0, "bfloat16": 320.0},
    # Ascend 910C (Atlas A3, "910_93"): 300 PFLOPS dense BF16 over the 384 chips of a CloudMatrix 384, i.e.
    # about 781 TFLOPS a chip. SemiAnalysis, "Huawei AI CloudMatrix 384 - China's answer to Nvidia GB200
    # NVL72", 2025-04-16,
    # https://semianalysis.com/2025/04/16/huawei-ai-cloudmatrix-384-chinas-answer-to-nvidia-gb200-nvl72/
    "ascend910_93": {"float16": 781.0, "bfloat16": 781.0},
}
#: Other names the same chips go by (``npu-smi``, mindformers' ``is_910a``/``is_910b``, the user's words).
CHIP_ALIASES = {"910a": "ascend910", "ascend910a": "ascend910", "910b": "ascend910b", "910c": "ascend910_93",
                "ascend910c": "ascend910_93", "910_93": "ascend910_93"}
#: A dtype's other spellings.
DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32"}


def peak_for(chip: str, dtype: str) -> Tuple[Optional[float], str]:
    """The peak TFLOPS of ``chip`` at ``dtype``, and the words that say which (or why there is none)."""
    chip = str(chip).lower()
    if chip.startswith("ascend910_93"):  # the A3 SoC names carry a suffix: Ascend910_9391, _9382 ...
        chip = "ascend910_93"
    elif chip.startswith("ascend910b"):  # Ascend910B1 ... B4
        chip = "ascend910b"
    chip = CHIP_ALIASES.get(chip, chip)
    dtype = DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    table = PEAK_TFLOPS.get(chip)
    if table is None:
        return None, f"{chip}: no peak figure (MFU is off)"
    if dtype not in table:
        return None, f"{chip} has no {dtype} peak figure, only {', '.join(table)} (MFU is off)"
    return table[dtype], f"{chip} {dtype}"


def this_chip() -> str:
    """The chip this process trains on: the Ascend SoC name MindSpore reports, else the device target."""
    import mindspore as ms

    target = str(ms.get_context("device_target")).lower()
    if target != "ascend":
        return target
    try:
        from mindspore._c_expression import MSContext

        return str(MSContext.get_instance().get_ascend_soc_version()).lower()
    except Exception:  # an older MindSpore without the SoC query
        return "ascend"


def compute_dtype(model_config: Optional[Mapping[str, Any]]) -> str:
    """The dtype the model multiplies in: its ``compute_dtype`` (mindformers), else float16 on Ascend's terms."""
    value = (model_config or {}).get("compute_dtype") or (model_config or {}).get("torch_dtype")
    return str(value) if value else "float16"


def resolve_peak(configured: Optional[float], model_config: Optional[Mapping[str, Any]],
                 chip: Optional[str] = None) -> Optional[float]:
    """The peak MFU is taken against: ``peak_tflops`` when set, else the table's for this chip (None: MFU off,
    said once)."""
    if configured:
        return float(configured)
    chip = this_chip() if chip is None else chip
    dtype = "float32" if chip == "cpu" else compute_dtype(model_config)
    peak, words = peak_for(chip, dtype)
    if peak is None:
        log.info("msbridge: %s; set peak_tflops to record perf/mfu", words)
    return peak
