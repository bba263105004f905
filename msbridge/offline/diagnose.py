"""Reads a run's jsonl and says what looks wrong, with the evidence: the readings mindformers' monitoring tutorial teaches (loss trend, grad-norm spikes, lr).

Each check returns a ``Diagnosis`` (what, at which steps, with which values, how
sure), or is skipped with the reason (a metric not recorded, too few steps).
Nothing before the end of the warm-up is judged: the warm-up ends where the lr
first reaches 99% of its peak, and never before 10% of the steps (at least 10).

Thresholds, all on robust statistics (rolling median, MAD scaled to sigma):

- ``lr_too_high``: after warm-up, the grad norm rises (Spearman rank correlation
  with the step >= 0.5, median of the last quarter >= 1.5x the first quarter)
  while the loss falls (last-quarter median below the first); a loss rising
  >= 5% as well is reported as divergence.
- ``loss_spike``: loss >= 6 sigma (MAD of log-residuals; the larger of the
  51-step and the run-wide one) and >= 20% above its 25-step centred rolling
  median, for at most 10 steps, and back within 10% of the level before it
  within 20 steps (a level change is not a spike). Run on the global loss and
  on every rank's local loss, so the rank that fed the batch is named.
- ``rank_outlier``: one rank has the highest local loss at >= 80% of the steps
  and its median excess over the other ranks is >= 3%.
- ``periodic_grad_spikes``: >= 4 grad-norm spikes (>= 2x and >= 5 sigma above the
  31-step rolling median) whose spacing is regular (>= 75% of the gaps within
  10% or 1 step of the median gap).
- ``nonfinite``: NaN/inf in a train/dist metric; on a step the loss scaler
  flagged as overflow (and skipped on purpose) only a non-finite loss counts.
- ``straggler`` and ``first_anomaly``: the distributed readings (``diagnose_dist``).
- ``slowdown``: the step got slower from one step on, and whether the input pipeline or the step slowed
  (``diagnose_perf``).

With per-layer grad norms in the log (``layer_norms``), a loss spike, grad-norm
spikes and NaN findings also name the layer whose grad norm went first
(``offline.layer_norms``).

Example:
    >>> report = diagnose(read_run("msbridge_runs/demo/run-1"))
    >>> print(report.to_text())
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import numpy as np

from ..names import EPOCH, GRAD_NORM, HISTOGRAM, LOSS, LOSS_SCALE, LR, OVERFLOW
from ..sinks.runlog import RunLog
from .diagnose_dist import check_first_anomaly, check_stragglers
from .diagnose_perf import check_slowdown
from .layer_norms import explain
from .report import Diagnosis, Report, Skip
from .series import global_loss, mad_sigma, metric_series, rank_losses, rolling_median, run_notes, warmup_end

MIN_STEPS = 30
SPIKE_Z, SPIKE_RATIO, SPIKE_MAX_LEN, RECOVERY_STEPS = 6.0, 1.2, 10, 20
GRAD_SPIKE_Z, GRAD_SPIKE_RATIO, MIN_PERIODIC_SPIKES = 5.0, 2.0, 4
OUTLIER_TOP_FRACTION, OUTLIER_EXCESS = 0.8, 0.03
_LOSSES = ("train/loss", "train/global_loss", "dist/loss")


# -- robust statistics --------------------------------------------------------
def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties sharing their average rank."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return (first + (counts - 1) / 2)[inverse]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Rank correlation (ties averaged); 0 when either side is constant."""
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.corrcoef(_ranks(x), _ranks(y))[0, 1]
    return 0.0 if math.isnan(rho) else float(rho)


def _episodes(idx: np.ndarray) -> List[np.ndarray]:
    """Runs of consecutive indices."""
    return np.split(idx, np.where(np.diff(idx) > 1)[0] + 1) if len(idx) else []


def _r(x: float) -> float:
    return float(f"{x:.4g}")


# -- the checks ------------------------------------------------------------------
def check_lr_too_high(run: RunLog, start: int) -> Optional[Diagnosis]:
    """Grad norm rising after warm-up while the loss falls (or rises too: divergence): the lr is likely too high.

    Fires when Spearman(step, grad norm) >= 0.5 and the last quarter's median grad
    norm is >= 1.5x the first quarter's, and the loss either fell (last-quarter
    median below the first) or rose >= 5% (divergence). Confidence = rho x
    min(1, log2(ratio)); with a falling loss it is halved when the lr itself fell
    by more than half over the window (late in a cosine schedule the grad norm
    often creeps up in healthy runs).
    """
    log = run.ranks[min(run.ranks)]
    if GRAD_NORM not in log.metric_names():
        raise Skip("no train/grad_norm recorded (grad_norm switched off, or the train step does not return it)")
    g_steps, grad = metric_series(log, GRAD_NORM)
    l_steps, loss = global_loss(run)
    common, gi, li = np.intersect1d(g_steps, l_steps, return_indices=True)
    keep = common >= start
    steps, grad, loss = common[keep], grad[gi][keep], loss[li][keep]
    if len(steps) < MIN_STEPS:
        raise Skip(f"only {len(steps)} steps with loss and grad norm after warm-up (step {start}); needs {MIN_STEPS}")
    q = len(steps) // 4
    g0, g1 = float(np.median(grad[:q])), float(np.median(grad[-q:]))
    l0, l1 = float(np.median(loss[:q])), float(np.median(loss[-q:]))
    rho, ratio = spearman(steps, grad), g1 / max(g0, 1e-12)
    falling, diverging = l1 < l0, l1 >= 1.05 * l0
    if rho < 0.5 or ratio < 1.5 or not (falling or diverging):
        return None
    confidence = rho * min(1.0, math.log2(ratio))
    why = f"grad norm rank-correlates with the step at {rho:.2f} and grew {ratio:.1f}x"
    lr_steps, lr = metric_series(log, LR)
    lr = lr[(lr_steps >= steps[0]) & (lr_steps <= steps[-1])]
    if falling and len(lr) and lr[-1] < 0.5 * lr[0]:
        confidence *= 0.5
        why += "; halved because the lr fell by more than half meanwhile (also seen in healthy runs)"
    span = f"steps {steps[0]}-{steps[q - 1]} -> {steps[-q]}-{steps[-1]}"
    if falling:
        title = f"grad norm keeps rising ({_r(g0)} -> {_r(g1)}) while the loss falls ({_r(l0)} -> {_r(l1)}), {span}"
        advice = "the lr is likely too high (training on the edge of instability): lower the lr or clip gradients"
    else:
        title = f"loss ({_r(l0)} -> {_r(l1)}) and grad norm ({_r(g0)} -> {_r(g1)}) both rising, {span}: diverging"
        advice = "the lr is likely too high: lower it, add gradient clipping, resume from a checkpoint before the rise"
    return Diagnosis("lr_too_high", title, advice, _r(confidence), why, GRAD_NORM, [int(steps[0]), int(steps[-1])],
                     evidence={"window": [int(steps[0]), int(steps[-1])], "grad_norm_median": [_r(g0), _r(g1)],
                               "loss_median": [_r(l0), _r(l1)], "spearman_grad_step": _r(rho)})


def _spikes(steps: np.ndarray, values: np.ndarray, start: int) -> List[Dict[str, Any]]:
    """Recovered loss spikes after ``start``: each with its steps, peak ratio and z.

    Residuals are taken in log space against the centred rolling median and scaled
    by the larger of a local (51-step) and the run-wide MAD, so neither the larger
    noise early in training nor a quiet stretch makes ordinary noise a spike. A level change moves the median with it, so it is never a spike;
    a spike that has not come back (or is too close to the end to tell) is left out.
    """
    log_v = np.log(values)
    resid = log_v - rolling_median(log_v, 25)
    judged = steps >= start
    run_wide = mad_sigma(resid[judged]) if judged.any() else 1e-12
    sigma = np.maximum(1.4826 * rolling_median(np.abs(resid), 51), run_wide)  # a quiet window never shrinks it
    z = resid / sigma
    hit = judged & (z >= SPIKE_Z) & (resid >= math.log(SPIKE_RATIO))
    found = []
    for ep in _episodes(np.flatnonzero(hit)):
        before = float(np.median(values[max(ep[0] - 25, 0):ep[0]]))
        after = values[ep[-1] + 1:ep[-1] + 1 + RECOVERY_STEPS]
        if len(ep) > SPIKE_MAX_LEN or not len(after) or np.min(after) > 1.1 * before:
            continue
        peak = int(ep[np.argmax(resid[ep])])
        found.append({"step": int(steps[peak]), "steps": [int(s) for s in steps[ep]], "value": _r(values[peak]),
                      "baseline": _r(before), "ratio": _r(math.exp(resid[peak])), "z": _r(z[peak])})
    return found


def check_loss_spikes(run: RunLog, start: int) -> List[Diagnosis]:
    """Loss spikes that come back within ``RECOVERY_STEPS``: suspect batches.

    Run on the global loss and on every rank's local loss; a spike seen in a
    rank's local loss names that rank. Confidence: high (0.9) when the loss at
    least doubled, medium (0.6) from 1.5x, low (0.4) below that.
    """
    sources = {"global": global_loss(run)}
    losses = rank_losses(run)
    if len(losses) > 1:
        sources.update({f"rank {r}": s for r, s in losses.items()})
    sources = {k: (s, v) for k, (s, v) in sources.items() if int(np.sum(s >= start)) >= MIN_STEPS}
    if not sources:
        raise Skip(f"fewer than {MIN_STEPS} loss values after warm-up (step {start})")
    sources = {k: (s, v) for k, (s, v) in sources.items() if v.min() > 0}
    if not sources:
        raise Skip("the loss has values <= 0; spikes are judged as ratios, which need a positive loss")
    merged: Dict[int, Dict[str, Any]] = {}
    for source, (steps, values) in sources.items():
        for spike in _spikes(steps, values, start):
            key = next((k for k in merged if abs(k - spike["step"]) <= 2), spike["step"])
            entry = merged.setdefault(key, {**spike, "seen_in": []})
            entry["seen_in"].append(source)
            if source == "global":  # the global loss is what the user watches: its numbers lead
                entry.update(spike, seen_in=entry["seen_in"])
    spikes = [merged[k] for k in sorted(merged)]
    if not spikes:
        return []
    top = max(s["ratio"] for s in spikes)
    ranks = sorted({int(src.split()[1]) for s in spikes for src in s["seen_in"] if src.startswith("rank")})
    steps = [s["step"] for s in spikes]
    where = "; ".join(f"step {s['step']}: {s['value']} vs {s['baseline']} before (x{s['ratio']}, "
                      f"in {', '.join(s['seen_in'])})" for s in spikes[:10])
    on_ranks = f" on rank(s) {', '.join(map(str, ranks))}" if ranks else ""
    return [Diagnosis("loss_spike", f"loss spiked and recovered at step(s) {', '.join(map(str, steps))}",
                      f"suspect batches: look at the samples fed at those steps{on_ranks}. {where}",
                      0.9 if top >= 2 else 0.6 if top >= 1.5 else 0.4,
                      f"largest spike x{top} over the rolling median, back to the earlier level within "
                      f"{RECOVERY_STEPS} steps", LOSS, steps, ranks, {"spikes": spikes})]


def check_rank_outlier(run: RunLog, start: int) -> Optional[Diagnosis]:
    """One rank's local loss consistently above the others: its data shard or its device.

    Fires when one rank has the highest loss at >= 80% of the judged steps and its
    median excess over the others' median is >= 3%. Confidence = top fraction x
    min(1, excess / 10%).
    """
    losses = rank_losses(run)
    if len(losses) < 2:
        raise Skip("only one rank in this run (no per-rank local losses)")
    common = np.array(sorted(set.intersection(*(set(s[s >= start].tolist()) for s, _ in losses.values()))))
    if len(common) < MIN_STEPS:
        raise Skip(f"only {len(common)} steps where every rank has a finite loss after warm-up; needs {MIN_STEPS}")
    ranks = list(losses)
    matrix = np.stack([v[np.searchsorted(s, common)] for s, v in losses.values()], axis=1)
    top = np.bincount(np.argmax(matrix, axis=1), minlength=len(ranks)) / len(common)
    i = int(np.argmax(top))
    others = np.median(np.delete(matrix, i, axis=1), axis=1)
    excess = float(np.median(matrix[:, i] / others - 1))
    if top[i] < OUTLIER_TOP_FRACTION or excess < OUTLIER_EXCESS:
        return None
    rank = ranks[i]
    return Diagnosis("rank_outlier", f"rank {rank}'s local loss is above the other ranks' at {top[i]:.0%} of steps "
                     f"{common[0]}-{common[-1]} (median +{excess:.1%})",
                     f"rank {rank}'s data shard (skewed or corrupt samples) or its device; compare the shard's "
                     "samples, then the device's health", _r(top[i] * min(1.0, excess / 0.1)),
                     f"highest of {len(ranks)} ranks at {top[i]:.0%} of {len(common)} steps, "
                     f"median excess {excess:.1%}",
                     LOSS, [int(common[0]), int(common[-1])], [rank],
                     {"top_fraction": {str(r): _r(t) for r, t in zip(ranks, top)}, "median_excess": _r(excess)})


def check_periodic_grad_spikes(run: RunLog, start: int) -> Optional[Diagnosis]:
    """Grad-norm spikes at a regular spacing: gradient accumulation or the data loader's cycle.

    Confidence = regular-gap fraction x min(1, spikes / 8).
    """
    log = run.ranks[min(run.ranks)]
    if GRAD_NORM not in log.metric_names():
        raise Skip("no train/grad_norm recorded (grad_norm switched off, or the train step does not return it)")
    steps, grad = metric_series(log, GRAD_NORM)
    keep = (grad > 0) & (steps >= start)
    steps, lg = steps[keep], np.log(grad[keep])
    if len(steps) < MIN_STEPS:
        raise Skip(f"only {len(steps)} grad-norm values after warm-up (step {start}); needs {MIN_STEPS}")
    resid = lg - rolling_median(lg, 31)
    sigma = mad_sigma(resid)
    hit = np.flatnonzero((resid >= math.log(GRAD_SPIKE_RATIO)) & (resid >= GRAD_SPIKE_Z * sigma))
    peaks = np.array([steps[ep[np.argmax(resid[ep])]] for ep in _episodes(hit)], dtype=np.int64)
    if len(peaks) < MIN_PERIODIC_SPIKES:
        return None
    gaps = np.diff(peaks)
    period = int(np.median(gaps))
    regular = float(np.mean(np.abs(gaps - period) <= max(1.0, 0.1 * period)))
    if period < 2 or regular < 0.75:
        return None
    cause = "gradient accumulation over that many micro-batches, or a data loader cycle of that many batches"
    epoch_steps, epochs = metric_series(log, EPOCH)
    per_epoch = int(np.sum(epochs == epochs[0])) if len(np.unique(epochs)) > 1 else 0
    if per_epoch and abs(per_epoch - period) <= max(1, 0.1 * period):
        cause = f"the period equals the steps per epoch ({per_epoch}): the data loader's cycle (epoch boundary)"
    ratio = float(np.exp(np.median(resid[np.isin(steps, peaks)])))
    return Diagnosis("periodic_grad_spikes", f"grad norm spikes every {period} steps ({len(peaks)} spikes, "
                     f"median x{ratio:.1f}, first at steps {', '.join(map(str, peaks[:5]))})",
                     f"likely {cause}; compare with gradient_accumulation_steps and dataset size / batch size",
                     _r(regular * min(1.0, len(peaks) / 8)), f"{regular:.0%} of {len(gaps)} gaps within 10% of "
                     f"{period} steps, {len(peaks)} spikes", GRAD_NORM, [int(p) for p in peaks],
                     evidence={"period": period, "spike_steps": [int(p) for p in peaks[:50]],
                               "median_ratio": _r(ratio)})


def check_nonfinite(run: RunLog) -> Optional[Diagnosis]:
    """NaN/inf in a train/ or dist/ metric on any rank.

    On a step the loss scaler flagged as overflow (and skipped) only a non-finite
    loss counts: inf gradients are what an overflow is.
    """
    bad: Dict[int, set] = {}
    ranks = set()
    for rank, log in run.ranks.items():
        for rec in log.records:
            names = [n for n in rec.nonfinite() if n.startswith(("train/", "dist/"))]
            if rec.values.get(OVERFLOW, 0.0) >= 0.5:  # the loss scaler skipped this step: inf grads expected
                names = [n for n in names if n.startswith(_LOSSES) and n != LOSS_SCALE]
            if names:
                bad.setdefault(rec.step, set()).update(names)
                ranks.add(rank)
    if not bad:
        return None
    steps = sorted(bad)
    first = steps[0]
    names = sorted(bad[first], key=lambda n: (not n.startswith("train/"), n))
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return Diagnosis("nonfinite", f"NaN/inf at {len(steps)} step(s), first at step {first} ({listed})",
                     "look at the grad norm and loss just before it; keep the checkpoint before step "
                     f"{first}, lower the lr or clip gradients, check that step's batch", 1.0,
                     "read directly from the log", LOSS, steps[:200], sorted(ranks),
                     {"steps": steps[:200], "metrics": {str(s): sorted(bad[s]) for s in steps[:20]}})


def diagnose(run: RunLog) -> Report:
    """Run every check on ``run``.

    Example:
        >>> report = diagnose(read_run("runs/tiny-lm/run-1"))
        >>> report.findings[0].title
        'loss spiked and recovered at step(s) 150, 220'
    """
    log = run.ranks[min(run.ranks)]
    all_steps = [s for lg in run.ranks.values()  # a streamed ColumnLog has its steps as one array
                 for s in (lg.steps().tolist() if hasattr(lg, "steps") else [r.step for r in lg.records])]
    report = Report(run.run_dir, str(log.header.get("run_name", "")), list(run.ranks),
                    (min(all_steps, default=0), max(all_steps, default=0)), notes=run_notes(run),
                    events=[{"kind": e.kind, "step": e.step, "rank": e.rank, "detail": dict(e.detail)}
                            for lg in run.ranks.values() for e in lg.events if e.kind != HISTOGRAM])
    if not all_steps:
        report.skipped["all"] = "no metrics lines in the run (it stopped before its first flush?)"
        return report
    start = warmup_end(run)
    checks = {"nonfinite": lambda: check_nonfinite(run), "lr_too_high": lambda: check_lr_too_high(run, start),
              "loss_spike": lambda: check_loss_spikes(run, start),
              "rank_outlier": lambda: check_rank_outlier(run, start),
              "periodic_grad_spikes": lambda: check_periodic_grad_spikes(run, start),
              "straggler": lambda: check_stragglers(run), "first_anomaly": lambda: check_first_anomaly(run),
              "slowdown": lambda: check_slowdown(run)}
    for name, check in checks.items():
        try:
            result = check()
        except Skip as why:
            report.skipped[name] = str(why)
            continue
        report.checks.append(name)
        report.findings += [r for r in (result if isinstance(result, list) else [result]) if r is not None]
    for finding in report.findings:  # with grad_norm/<layer> in the log: which layer went first
        explain(finding, log)
    return report
