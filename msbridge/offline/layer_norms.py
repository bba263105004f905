"""Per-layer grad norms in a run's log (``grad_norm/<param or layer>``): the largest, and which spiked first.

``plot`` draws the layers with the largest median grad norm; ``diagnose`` adds
to a loss spike, a grad-norm spike or a NaN the layer whose grad norm went
first: a spike is the grad norm >= 2x its own 25-step rolling median and >= 5
sigma (MAD of its log-residuals), within the 10 steps up to the finding's step.

Example:
    >>> layers = layer_grad_norms(read_run("runs/tiny-lm/run-1").ranks[0])
    >>> top_layers(layers, 3)
    ['model.layers.1.attention.wo.weight', 'lm_head.weight', 'model.layers.0.feed_forward.w2.weight']
    >>> first_spike(layers, 150)
    {'layer': 'model.layers.1.attention.wo.weight', 'step': 149, 'ratio': 7.3, 'z': 12.1}
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import numpy as np

from ..names import GRAD_NORM_PREFIX
from ..sinks.runlog import RankLog
from .series import Series, mad_sigma, metric_series, rolling_median

SPIKE_RATIO, SPIKE_Z, LOOKBACK, BASELINE_STEPS = 2.0, 5.0, 10, 25


def layer_grad_norms(log: RankLog, finite: bool = True) -> Dict[str, Series]:
    """``{param or layer: (steps, values)}`` of every ``grad_norm/*`` metric of one rank."""
    return {name[len(GRAD_NORM_PREFIX):]: metric_series(log, name, finite)
            for name in log.metric_names() if name.startswith(GRAD_NORM_PREFIX)}


def top_layers(layers: Dict[str, Series], count: int = 6) -> List[str]:
    """The ``count`` layers with the largest median grad norm, largest first."""
    medians = {name: float(np.median(v)) for name, (_, v) in layers.items() if len(v)}
    return sorted(medians, key=medians.get, reverse=True)[:count]


def _spike_steps(steps: np.ndarray, values: np.ndarray) -> Dict[int, Dict[str, float]]:
    """Steps where one layer's grad norm is a spike, with its ratio and z."""
    keep = values > 0
    steps, log_v = steps[keep], np.log(values[keep])
    if len(steps) < 2 * LOOKBACK:
        return {}
    resid = log_v - rolling_median(log_v, BASELINE_STEPS)
    sigma = mad_sigma(resid)
    hit = (resid >= math.log(SPIKE_RATIO)) & (resid >= SPIKE_Z * sigma)
    return {int(s): {"ratio": float(math.exp(r)), "z": float(r / sigma)}
            for s, r in zip(steps[hit], resid[hit])}


def first_spike(layers: Dict[str, Series], step: int) -> Optional[Dict[str, Any]]:
    """The layer whose grad norm spiked first in the ``LOOKBACK`` steps up to ``step`` (None: none did).

    Ties (same first step) go to the larger ratio.
    """
    best: Optional[Dict[str, Any]] = None
    for name, (steps, values) in layers.items():
        hits = {s: h for s, h in _spike_steps(steps, values).items() if step - LOOKBACK <= s <= step}
        if not hits:
            continue
        first = min(hits)
        found = {"layer": name, "step": first, "ratio": round(hits[first]["ratio"], 3),
                 "z": round(hits[first]["z"], 1)}
        if best is None or (first, -found["ratio"]) < (best["step"], -best["ratio"]):
            best = found
    return best


def first_nonfinite(log: RankLog) -> Optional[Dict[str, Any]]:
    """The first step where some layer's grad norm is NaN/inf, and those layers (None: never)."""
    bad: Dict[int, List[str]] = {}
    for name, (steps, values) in layer_grad_norms(log, finite=False).items():
        hit = steps[~np.isfinite(values)]
        if len(hit):
            bad.setdefault(int(hit[0]), []).append(name)
    if not bad:
        return None
    step = min(bad)
    return {"step": step, "layers": sorted(bad[step])}


def explain(finding: Any, log: RankLog) -> None:
    """Add the first spiking (or first non-finite) layer to a spike or NaN finding: evidence and advice."""
    if finding.check == "nonfinite":
        found = first_nonfinite(log)
        if found is not None:
            finding.evidence["first_layer"] = found
            shown = ", ".join(found["layers"][:3]) + (" ..." if len(found["layers"]) > 3 else "")
            finding.advice += f". First non-finite grad norm: {shown} at step {found['step']}"
        return
    if finding.check not in ("loss_spike", "periodic_grad_spikes") or not finding.steps:
        return
    found = first_spike(layer_grad_norms(log), int(finding.steps[0]))
    if found is not None:
        finding.evidence["first_layer"] = found
        finding.advice += (f". The first layer whose grad norm spiked: {found['layer']} at step {found['step']} "
                           f"(x{found['ratio']:g} over its rolling median)")
