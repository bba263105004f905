"""Running examples/mindformers/train.py in a fresh process and reading what mindformers itself wrote.

Each run is ``examples/mindformers/train.py`` in its own process (mindformers fixes its
log dir and registries per process); ``mf_lines`` reads MFLossMonitor's per-step lines
from mindformers' own log, the reference the tests compare msbridge's records with.

Example:
    >>> out = train(tmp_path / "work", steps=6, config=variant(tmp_path, "tb.yaml", "tensorboard: ..."))
    >>> mf_lines(tmp_path / "work")[1]["train/loss"]
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mindformers"
#: The trimmed real mindformers run YAMLs (each names its source in its first line).
RUN_YAMLS = sorted(str(p) for p in (ROOT / "tests" / "data" / "mindformers_runs").glob("*.yaml"))
# MFLossMonitor: "{ Epoch:[  1/  1], step:[    2/   30], loss:[5.549915/5.547392], per_step_time: 1869ms,
#                  lr: 0.0033333334, overflow cond: False, loss_scale: 1.0, global_norm: [1.00614]"
MF_LINE = re.compile(r"step:\[\s*(\d+)/\s*\d+\], loss:\[([-\d.e+]+)/[^\]]*\], per_step_time: \d+ms, "
                     r"lr: ([-\d.e+]+), overflow cond: (\w+), loss_scale: ([-\d.e+]+), global_norm: \[([-\d.e+]+)\]")


def train(work: Path, steps: int, config: Path = EXAMPLE / "tiny_llama.yaml") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LOG_MF_PATH"}  # mindformers logs under WORK/output/log
    return subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--config", str(config),
                           "--steps", str(steps), "--work", str(work)],
                          env=dict(env, GLOG_v="3"), capture_output=True, text=True, timeout=900)


class Printed(float):
    """The loss as MFLossMonitor printed it, with half a unit of its last digit: mindformers 1.9 prints 6
    decimals, 1.6 prints 3 (``loss:[5.545/5.545]``). The other values are printed in full (``repr``)."""

    def __new__(cls, text: str) -> "Printed":
        value = super().__new__(cls, text)
        value.half_ulp = 0.5 * 10.0 ** Decimal(text).as_tuple().exponent
        return value


def mf_lines(work: Path) -> Dict[int, Dict[str, float]]:
    """MFLossMonitor's values by step, from mindformers' own log."""
    text = (work / "output" / "log" / "rank_0" / "info.log").read_text()
    return {int(m[1]): {"train/loss": Printed(m[2]), "train/lr": float(m[3]), "train/overflow": float(m[4] == "True"),
                        "train/loss_scale": float(m[5]), "train/grad_norm": float(m[6])}
            for m in MF_LINE.finditer(text)}


def variant(tmp_path: Path, name: str, text: str) -> Path:
    """A run YAML that takes the example's and overrides some sections (mindformers' base_config)."""
    path = tmp_path / name
    path.write_text(f"base_config: {EXAMPLE / 'tiny_llama.yaml'}\n{text}")
    return path


def only_run(work: Path) -> str:
    runs = [p for p in (work / "msbridge_runs" / "tiny-llama").iterdir() if (p / "run.json").exists()]
    assert len(runs) == 1, runs
    return str(runs[0])


def close(series: List, want: Dict[int, Dict[str, float]], name: str) -> None:
    """Equal to what mindformers printed, up to float32 and the digits it printed."""
    steps = [s for s, _ in series]
    expected = [want[s][name] for s in steps]
    np.testing.assert_allclose([v for _, v in series], expected, rtol=2e-6,
                               atol=max([2e-6] + [getattr(w, "half_ulp", 0.0) for w in expected]), err_msg=name)


def do_eval_yaml(every: int, eval_dir: object = "eval") -> str:
    """The run YAML lines that turn on mindformers' own evaluation (``do_eval``, PerplexityMetric) every ``every``
    steps, on the MindRecord in ``eval_dir`` (relative to the work dir, or absolute); its ``callbacks:`` follow."""
    return f"""do_eval: True
eval_step_interval: {every}
eval_epoch_interval: -1
metric:
  type: PerplexityMetric
eval_dataset: &eval_dataset
  data_loader:
    type: MindDataset
    dataset_dir: "{eval_dir}/train.mindrecord"
    shuffle: False
  input_columns: ["input_ids"]
  num_parallel_workers: 1
  python_multiprocessing: False
  drop_remainder: True
  batch_size: 4
  repeat: 1
  numa_enable: False
  prefetch_size: 1
eval_dataset_task:
  type: CausalLanguageModelDataset
  dataset_config: *eval_dataset
"""
