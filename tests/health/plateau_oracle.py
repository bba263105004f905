"""The plateau step re-derived by hand, independently of ``msbridge.health.detectors.plateau``: the test oracle."""
from typing import Optional, Sequence


def first_plateau(values: Sequence[float], decay: Optional[float], warmup: int, patience: int,
                  min_delta: float = 1e-3) -> Optional[int]:
    """The first step ``patience`` steps after the last improvement of the EMA (``decay``; None: the raw
    values) by more than ``min_delta``, counting after ``warmup`` steps."""
    ema, best, wait = None, None, 0
    for step, value in enumerate(values, 1):
        ema = value if ema is None or decay is None else decay * ema + (1 - decay) * value
        if step <= warmup:
            continue
        if best is None or ema < best - min_delta:
            best, wait = ema, 0
        else:
            wait += 1
            if wait == patience:
                return step
    return None
