"""Reads the chip table ``npu-smi info`` prints: power, temperature, AICore use, memory and HBM per chip.

``npu-smi info`` prints two table lines per chip under a two-line header
(Ascend's documentation, "npu-smi info: 查询基本信息"; the columns vary by product):

    | NPU   Name     | Health   | Power(W)   Temp(C)          Hugepages-Usage(page) |
    | Chip  [Device] | Bus-Id   | AICore(%)  Memory-Usage(MB) [HBM-Usage(MB)]        |
    +================+==========+=================================================+
    | 0     910B3    | OK       | 93.1       38               0    / 0              |
    | 0              | 0000:C1:00.0 | 12     0    / 0         3379 / 65536          |

then a process table (``Process id``, ``Process name`` ...), which is not read.
The third cell of each line is read by the header's column names, so a product
without HBM (Memory-Usage only) or without hugepages reads the same way; an
``NA`` is left out.

Example:
    >>> chips = parse_npu_smi(subprocess.run(["npu-smi", "info"], capture_output=True, text=True).stdout)
    >>> chips[0]["hbm_used_mb"], chips[0]["aicore_pct"]
    (3379.0, 12.0)
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence

from ..names import (
    NPU_HBM_TOTAL_MB,
    NPU_HBM_USED_MB,
    NPU_MEMORY_TOTAL_MB,
    NPU_MEMORY_USED_MB,
    NPU_POWER,
    NPU_TEMPERATURE,
    NPU_UTILIZATION,
)

Chip = Dict[str, float]

# Header column -> the key (or used/total key pair) its value is read into.
_COLUMNS = {
    "Power(W)": ("power_w",), "Temp(C)": ("temperature_c",), "AICore(%)": ("aicore_pct",),
    "Hugepages-Usage(page)": ("hugepages_used", "hugepages_total"),
    "Memory-Usage(MB)": ("memory_used_mb", "memory_total_mb"), "HBM-Usage(MB)": ("hbm_used_mb", "hbm_total_mb"),
}
_VALUE = re.compile(r"(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)|(NA|-?\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"^-?\d+$")

#: chip key -> metric name, for the rank's own chip.
METRICS = {"aicore_pct": NPU_UTILIZATION, "hbm_used_mb": NPU_HBM_USED_MB, "hbm_total_mb": NPU_HBM_TOTAL_MB,
           "memory_used_mb": NPU_MEMORY_USED_MB, "memory_total_mb": NPU_MEMORY_TOTAL_MB,
           "temperature_c": NPU_TEMPERATURE, "power_w": NPU_POWER}


def _cells(line: str) -> Optional[List[str]]:
    """The cells of a table line ``| a | b | c |`` (None for a rule or any other line)."""
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")):
        return None
    return [c.strip() for c in line[1:-1].split("|")]


def _values(cell: str, columns: Sequence[str]) -> Chip:
    """The third cell's values, named by the header's columns (``a / b`` is one column)."""
    out: Chip = {}
    for column, match in zip(columns, _VALUE.finditer(cell)):
        keys = _COLUMNS.get(column)
        if keys is None:
            continue
        used, total, single = match.groups()
        if single is not None:
            if single != "NA":
                out[keys[0]] = float(single)
        elif len(keys) == 2:
            out[keys[0]], out[keys[1]] = float(used), float(total)
    return out


def parse_npu_smi(text: str) -> List[Chip]:
    """Every chip in ``npu-smi info`` output, in the order printed: ``npu``, ``chip`` and the values read.

    Raises:
        ValueError: the text has no chip table header (not ``npu-smi info`` output).
    """
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if "AICore(%)" in line and "Bus-Id" in line), None)
    if header is None or header == 0:
        raise ValueError("not npu-smi info output: no 'Chip | Bus-Id | AICore(%) ...' header line")
    first_columns = (_cells(lines[header - 1]) or ["", "", ""])[-1].split()
    second_columns = (_cells(lines[header]) or ["", "", ""])[-1].split()
    rows: List[List[str]] = []
    for line in lines[header + 1:]:
        if "Process id" in line or "Process name" in line:
            break  # the process table follows the chips
        cells = _cells(line)
        if cells is not None and len(cells) == 3:
            rows.append(cells)
    chips: List[Chip] = []
    for top, bottom in zip(rows[0::2], rows[1::2]):
        npu, chip = top[0].split(), bottom[0].split()
        if not (npu and chip and _NUMBER.match(npu[0]) and _NUMBER.match(chip[0])):
            continue
        values = {"npu": float(npu[0]), "chip": float(chip[0])}
        values.update(_values(top[2], first_columns))
        values.update(_values(bottom[2], second_columns))
        chips.append(values)
    return chips


def chip_metrics(chip: Chip) -> Dict[str, float]:
    """The ``system/npu_*`` metrics of one chip; memory without a size (``0 / 0``, on HBM chips) is left out."""
    out = {METRICS[key]: value for key, value in chip.items() if key in METRICS}
    for used, total in (("memory_used_mb", "memory_total_mb"), ("hbm_used_mb", "hbm_total_mb")):
        if not chip.get(total):
            out.pop(METRICS[used], None)
            out.pop(METRICS[total], None)
    return out
