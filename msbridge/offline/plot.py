"""One PNG of a run from its jsonl: loss, per-rank losses, grad norm (and per layer), lr, throughput;
anomalies in red.

Every rank's file is read. Red marks: dashed lines at recorded events, an
``x`` on top of a panel (and a faint line through all panels) at every step
whose value is NaN/inf, so a NaN is never hidden by smoothing, and the steps
``diagnose`` names (spikes circled, the rising grad-norm window shaded). The
footer lists the findings and notes (a line cut by a killed run).

matplotlib is imported here only, with its Agg canvas (no display, no pyplot
state): ``pip install 'msbridge[plot]'``.

Example:
    >>> from msbridge.sinks.runlog import read_run
    >>> plot_run(read_run("msbridge_runs/demo/run-1"), "run-1.png")
    'run-1.png'
"""
from __future__ import annotations

import math
import textwrap
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import MsbridgeError
from ..names import GLOBAL_LOSS, GRAD_NORM, HISTOGRAM, LOSS, LOSS_EMA, LR, SAMPLES_PER_S, TOKENS_PER_S
from ..sinks.runlog import RunLog
from .layer_norms import layer_grad_norms, top_layers
from .report import Report
from .series import Series, global_loss, metric_series, rank_losses, run_notes

TOP_LAYERS = 6

RED = "#d62728"


def _matplotlib() -> Tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MsbridgeError("msbridge plot needs matplotlib, which is not installed; "
                            "fix: pip install 'msbridge[plot]'") from None
    return Figure, FigureCanvasAgg


def _log_helps(values: np.ndarray) -> bool:
    """True when every finite value is positive and they span more than one decade."""
    finite = values[np.isfinite(values)]
    return bool(len(finite)) and finite.min() > 0 and finite.max() / finite.min() > 10


def _scale(ax: Any, values: np.ndarray) -> None:
    """Log y with plain tick labels (0.3, 2, 40); minor ticks labelled only as far as they fit the span."""
    from matplotlib.ticker import FuncFormatter

    finite = values[np.isfinite(values) & (values > 0)]
    decades = math.log10(finite.max() / finite.min()) if len(finite) else 0.0
    subs = (2, 3, 5) if decades < 1.6 else (2, 5) if decades < 3 else ()
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(
        lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v)), 6) in subs else ""))


def _line(ax: Any, series: Series, label: str, **style: Any) -> List[int]:
    """Draw one series (NaN breaks the line); returns the steps whose value is not finite."""
    steps, values = series
    ax.plot(steps, values, label=label, **style)
    return [int(s) for s in steps[~np.isfinite(values)]]


def _mark_nonfinite(ax: Any, steps: Sequence[int], what: str) -> None:
    if steps:
        ax.plot(steps, [0.96] * len(steps), "x", color=RED, ms=9, mew=2, transform=ax.get_xaxis_transform(),
                label=f"{what} NaN/inf ({len(steps)} step{'s' * (len(steps) > 1)})", clip_on=False)


def _missing(ax: Any, name: str) -> None:
    ax.set_yticks([])
    ax.text(0.5, 0.5, f"{name} not recorded", transform=ax.transAxes, ha="center", va="center",
            color="0.45", fontsize=11)


def _at(series: Series, steps: Sequence[int]) -> Series:
    s, v = series
    keep = np.isin(s, steps)
    return s[keep], v[keep]


def _ema(values: np.ndarray, decay: float = 0.9) -> np.ndarray:
    """Exponential moving average as Stream computes ``train/loss_ema``: non-finite values are skipped."""
    out, ema = np.empty_like(values), math.nan
    for i, value in enumerate(values.tolist()):
        if math.isfinite(value):
            ema = value if math.isnan(ema) else decay * ema + (1 - decay) * value
        out[i] = ema
    return out


def _draw_loss(ax: Any, run: RunLog, findings: Dict[str, Any]) -> List[int]:
    log = run.ranks[min(run.ranks)]
    name = GLOBAL_LOSS if GLOBAL_LOSS in log.metric_names() else LOSS
    raw = metric_series(log, name, finite=False)
    if not len(raw[0]):
        _missing(ax, LOSS)
        return []
    several = len(run.ranks) > 1 or any(n.startswith("dist/") for n in log.metric_names())
    bad = _line(ax, raw, "global loss" if several else "loss", color="C0", lw=0.8, alpha=0.45)
    # train/loss_ema smooths rank 0's local loss: with several ranks the global loss gets its own EMA here.
    ema = (raw[0], _ema(raw[1])) if several else metric_series(log, LOSS_EMA)
    if len(ema[0]):
        ax.plot(*ema, color="C0", lw=2, label=f"{'global ' * several}loss EMA")
    _mark_nonfinite(ax, bad, "loss")
    spike = findings.get("loss_spike")
    if spike is not None:
        ax.plot(*_at(global_loss(run), spike.steps), "o", ms=11, mfc="none", mec=RED, mew=2,
                label=f"loss spike (step {', '.join(map(str, spike.steps[:4]))}{'...' * (len(spike.steps) > 4)})")
    if _log_helps(raw[1]):
        _scale(ax, raw[1])
    ax.set_ylabel("loss")
    ax.set_title("Loss" + (" (log scale)" if _log_helps(raw[1]) else ""))
    return bad


def _draw_rank_losses(ax: Any, run: RunLog, findings: Dict[str, Any]) -> List[int]:
    losses = rank_losses(run, finite=False)
    outlier = findings.get("rank_outlier")
    odd = outlier.ranks[0] if outlier is not None else None
    bad: List[int] = []
    crowd = len(losses) > 8  # beyond that the ordinary ranks share one grey legend entry
    grey_label = f"other ranks ({len(losses) - (odd is not None)})"
    for i, (rank, series) in enumerate(losses.items()):
        if rank == odd:
            label, style = f"rank {rank} - above the others", {"color": RED, "lw": 1.6, "zorder": 3}
        elif crowd:
            label, style = grey_label, {"color": "0.55", "lw": 0.6}
            grey_label = "_nolegend_"
        else:
            label, style = f"rank {rank}", {"color": f"C{(i + 1) % 10}", "lw": 0.8}
        bad += _line(ax, series, label, alpha=0.85, **style)
    _mark_nonfinite(ax, sorted(set(bad)), "local loss")
    values = np.concatenate([v for _, v in losses.values()])
    if _log_helps(values):
        _scale(ax, values)
    ax.set_ylabel("local loss")
    ax.set_title(f"Local loss per rank ({len(losses)} ranks)")
    return bad


def _draw_grad_norm(ax: Any, run: RunLog, findings: Dict[str, Any]) -> List[int]:
    raw = metric_series(run.ranks[min(run.ranks)], GRAD_NORM, finite=False)
    if not len(raw[0]):
        _missing(ax, GRAD_NORM)
        ax.set_title("Gradient norm")
        return []
    bad = _line(ax, raw, "grad norm", color="C2", lw=0.9)
    _mark_nonfinite(ax, bad, "grad norm")
    rising = findings.get("lr_too_high")
    if rising is not None:
        ax.axvspan(rising.steps[0], rising.steps[-1], color=RED, alpha=0.08, label="grad norm rising (lr too high?)")
    periodic = findings.get("periodic_grad_spikes")
    if periodic is not None:
        ax.plot(*_at(raw, periodic.steps), "v", color=RED, ms=6,
                label=f"periodic spikes (every {periodic.evidence['period']} steps)")
    finite = raw[1][np.isfinite(raw[1])]
    log = bool(len(finite)) and finite.min() > 0
    if log:
        _scale(ax, raw[1])
    ax.set_ylabel("L2 norm of gradients")
    ax.set_title("Gradient norm" + (" (log scale)" if log else ""))
    return bad


def _draw_layers(ax: Any, run: RunLog, findings: Dict[str, Any]) -> List[int]:
    """The ``TOP_LAYERS`` layers (or parameters) with the largest median grad norm; the first to spike circled."""
    layers = layer_grad_norms(run.ranks[min(run.ranks)], finite=False)
    top = top_layers({k: (s, v[np.isfinite(v)]) for k, (s, v) in layers.items()}, TOP_LAYERS)
    bad: List[int] = []
    for i, name in enumerate(top):
        bad += _line(ax, layers[name], name, color=f"C{i % 10}", lw=0.8)
    for finding in findings.values():
        first = finding.evidence.get("first_layer", {})
        if first.get("layer") in layers:
            steps, values = _at(layers[first["layer"]], [first["step"]])
            ax.plot(steps, values, "o", ms=11, mfc="none", mec=RED, mew=2,
                    label=f"first to spike: {first['layer']} (step {first['step']})")
    finite = np.concatenate([v[np.isfinite(v)] for _, v in (layers[n] for n in top)])
    if len(finite) and finite.min() > 0:
        _scale(ax, finite)
    ax.set_ylabel("L2 norm of gradients")
    ax.set_title(f"Gradient norm per layer (top {len(top)} of {len(layers)} by median)")
    return bad


def _draw_lr(ax: Any, run: RunLog) -> List[int]:
    raw = metric_series(run.ranks[min(run.ranks)], LR, finite=False)
    ax.set_title("Learning rate")
    if not len(raw[0]):
        _missing(ax, LR)
        return []
    bad = _line(ax, raw, "lr", color="C4", lw=1.2)
    ax.set_ylabel("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    return bad


def _draw_throughput(ax: Any, run: RunLog) -> List[int]:
    log = run.ranks[min(run.ranks)]
    name, unit = (TOKENS_PER_S, "tokens/s") if TOKENS_PER_S in log.metric_names() else (SAMPLES_PER_S, "samples/s")
    raw = metric_series(log, name, finite=False)
    ax.set_title(f"Throughput (rank {log.rank})")
    if not len(raw[0]):
        _missing(ax, "perf/samples_per_s")
        return []
    bad = _line(ax, raw, unit, color="C1", lw=0.8)
    finite = raw[1][np.isfinite(raw[1])]
    if len(finite):
        ax.set_ylim(0, 1.15 * float(np.percentile(finite, 99)))  # one stalled or instant step must not flatten it
        ax.axhline(float(np.median(finite)), color="C1", ls=":", lw=1, label=f"median {np.median(finite):,.0f} {unit}")
    ax.set_ylabel(unit)
    return bad


def _draw_events(axes: Sequence[Any], run: RunLog, nonfinite: Sequence[int]) -> int:
    """Red dashed lines at events, faint red lines at non-finite steps, on every panel."""
    events = sorted((e for log in run.ranks.values() for e in log.events if e.kind != HISTOGRAM), key=lambda e: e.step)
    for i, ax in enumerate(axes):
        for j, event in enumerate(events):
            ax.axvline(event.step, color=RED, ls="--", lw=1, alpha=0.8,
                       label=f"events ({len(events)})" if j == 0 else None)
            if i == 0 and j < 10:
                ax.annotate(f"{event.kind} @{event.step}", (event.step, 0.0), xycoords=ax.get_xaxis_transform(),
                            xytext=(3, 4), textcoords="offset points", color=RED, fontsize=8, rotation=90,
                            va="bottom")
        for step in nonfinite:
            ax.axvline(step, color=RED, lw=0.6, alpha=0.35)
    return len(events)


def _footer_lines(run: RunLog, report: Optional[Report]) -> List[Tuple[str, bool]]:
    """(line, red) pairs: findings and notes in red, then "no findings" and skipped checks grouped by reason."""
    red = [f"{f.check} [{f.level}]: {f.title}" for f in (report.findings if report else [])]
    red += [f"note: {note}" for note in run_notes(run)]
    plain = []
    if report is not None and not report.findings:
        plain.append(f"diagnose: no findings (checks run: {', '.join(report.checks) or 'none'})")
    reasons: Dict[str, List[str]] = {}
    for check, reason in (report.skipped.items() if report else ()):
        reasons.setdefault(reason, []).append(check)
    plain += [f"skipped {', '.join(checks)}: {reason}" for reason, checks in reasons.items()]
    return [(part, is_red) for lines, is_red in ((red, True), (plain, False)) for line in lines
            for part in textwrap.wrap(line, 150, subsequent_indent="    ")]


def _footer(ax: Any, lines: List[Tuple[str, bool]]) -> None:
    ax.axis("off")
    for i, (line, is_red) in enumerate(lines):
        text = ax.annotate(line, (0.0, 1.0), xycoords="axes fraction", xytext=(0, -12 * i), textcoords="offset points",
                           va="top", fontsize=9, family="monospace", color=RED if is_red else "0.25")
        text.set_in_layout(False)


def draw(run: RunLog, report: Optional[Report] = None) -> Any:
    """The run as a matplotlib ``Figure`` (Agg canvas); ``report`` (from ``diagnose``) adds its marks and footer.

    Panels, top to bottom: loss (global, with its EMA), local loss per rank (when
    there are several), grad norm, grad norm per layer (with ``layer_norms``: the
    largest ones, the first to spike circled), lr, throughput, then a footer of findings.

    Example:
        >>> fig = draw(read_run("runs/tiny-lm/run-1"))
        >>> [ax.get_title() for ax in fig.axes][:2]
        ['Loss (log scale)', 'Gradient norm (log scale)']
    """
    if not any(log.records for log in run.ranks.values()):
        raise MsbridgeError(f"{run.run_dir}: nothing to plot, no metrics lines yet (stopped before the first flush?)")
    Figure, FigureCanvasAgg = _matplotlib()
    findings = {f.check: f for f in (report.findings if report else [])}
    per_rank = len(rank_losses(run)) > 1
    per_layer = bool(layer_grad_norms(run.ranks[min(run.ranks)]))
    n = 4 + per_rank + per_layer
    lines = _footer_lines(run, report)
    footer_in = 0.3 + 0.17 * len(lines)  # inches: one 9 pt line each
    fig = Figure(figsize=(12, 2.6 * n + 0.9 + footer_in), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(n + 1, 1, sharex=True, height_ratios=[2.6] * n + [footer_in])
    panels = list(axes[:-1])
    bad = _draw_loss(panels[0], run, findings)
    if per_rank:
        bad += _draw_rank_losses(panels[1], run, findings)
    bad += _draw_grad_norm(panels[-3 - per_layer], run, findings)
    if per_layer:
        bad += _draw_layers(panels[-3], run, findings)
    bad += _draw_lr(panels[-2], run) + _draw_throughput(panels[-1], run)
    nonfinite = sorted(set(bad))
    events = _draw_events(panels, run, nonfinite)
    for ax in panels:
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)  # outside: never over a mark
    panels[-1].set_xlabel("training step")
    panels[-1].tick_params(labelbottom=True)
    header = run.header
    steps = [s for log in run.ranks.values() for s in _step_range(log)]
    fig.suptitle(f"{header.get('run_name', 'run')}  ({header.get('experiment', '')})\n"
                 f"run {str(header.get('run_id', ''))[:12]} - {len(run.ranks)} rank file(s) of world size "
                 f"{header.get('world_size', 1)} - steps {min(steps)}-{max(steps)} - {events} event(s) - "
                 f"{len(nonfinite)} non-finite step(s)", fontsize=12)
    _footer(axes[-1], lines)
    return fig


def _step_range(log: Any) -> List[int]:
    """The first and last step of a rank's records (none when it has none); columns when streamed."""
    steps = log.steps() if hasattr(log, "steps") else [r.step for r in log.records]
    return [int(min(steps)), int(max(steps))] if len(steps) else []


def plot_run(run: RunLog, output: str, report: Optional[Report] = None) -> str:
    """Draw ``run`` (see ``draw``) into the PNG ``output``; returns ``output``.

    Example:
        >>> run = read_run("runs/tiny-lm/run-1")
        >>> plot_run(run, "runs/tiny-lm/run-1/plot.png", diagnose(run))
        'runs/tiny-lm/run-1/plot.png'
    """
    draw(run, report).savefig(output, dpi=110)
    return output
