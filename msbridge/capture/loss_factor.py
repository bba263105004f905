"""What mindformers multiplies the reported loss by: MFLossMonitor's own rule, else its pipeline cell's.

Under pipeline parallel or gradient accumulation mindformers' train cell (``MFPipelineWithLossScaleCell``) returns
the loss summed over micro batches; MFLossMonitor divides it before it prints it. msbridge records the loss, and
mindformers' separate losses, as MFLossMonitor prints them, so both read this one rule.

Example:
    >>> loss_factor([], None)
    (1.0, '')
"""
from __future__ import annotations

import inspect
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ..names import PIPELINE_CELL


def pipeline_cell(network: Any) -> Optional[Any]:
    """mindformers' pipeline cell inside ``network``, None when it has none (or is not a MindSpore cell)."""
    from mindspore import nn

    if not isinstance(network, nn.Cell):
        return None
    return next((c for _, c in network.cells_and_names() if type(c).__name__ == PIPELINE_CELL), None)


def loss_factor(callbacks: Sequence[Any], cell: Optional[Any]) -> Tuple[float, str]:
    """What the recorded loss is multiplied by, and who said so: MFLossMonitor's own rule when it runs, else the
    pipeline ``cell``'s micro batches (unless it computes a per-token loss), else 1."""
    monitor = next((cb for cb in callbacks or () if type(cb).__name__ == "MFLossMonitor"), None)
    factor = _monitor_factor(monitor)
    if factor is not None:
        return factor, "MFLossMonitor's _fix_loss_for_parallel"
    if cell is not None and not getattr(cell, "calculate_per_token_loss", False):
        return 1.0 / max(int(getattr(cell, "micro_size", 1) or 1), 1), f"{PIPELINE_CELL}'s micro_batch_num"
    return 1.0, ""


def _monitor_factor(monitor: Any) -> Optional[float]:
    """MFLossMonitor's own ``_fix_loss_for_parallel`` applied to 1.0, without its one-time warnings (None: no
    such method, or one this code cannot call)."""
    fix = getattr(monitor, "_fix_loss_for_parallel", None)
    if fix is None:
        return None
    try:
        if "print_warning" in inspect.signature(fix).parameters:  # mindformers 1.9
            return float(fix(np.float64(1.0), print_warning=False))
        if not hasattr(monitor, "print_warning_flag"):
            return float(fix(np.float64(1.0)))
        flag, monitor.print_warning_flag = monitor.print_warning_flag, False  # 1.6: its warnings hang on this flag
        try:
            return float(fix(np.float64(1.0)))
        finally:
            monitor.print_warning_flag = flag
    except (AttributeError, TypeError, ValueError):  # another mindformers version: fall back to the cell
        return None
