"""What ``msbridge diagnose`` hands back: ``Diagnosis`` (one reading), ``Report`` (all of a run), as text or JSON.

Example:
    >>> report = diagnose(read_run("msbridge_runs/demo/run-1"))
    >>> print(report.to_text())
    >>> json.dumps(report.to_dict())
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Tuple


class Skip(Exception):
    """A check that cannot run on this run; the message says why."""


@dataclass
class Diagnosis:
    """One reading: what looks wrong, where, how sure, and what to do.

    Attributes:
        check: the check's name (``loss_spike`` ...).
        title: one line, plain words.
        advice: what it likely means and what to look at.
        confidence: 0..1; ``level`` is low (< 0.45), medium (< 0.75) or high.
        why: how the confidence was reached.
        metric: the series ``steps`` refer to.
        steps / ranks: where it is (plot marks these).
        evidence: the numbers behind it.

    Example:
        >>> f = Diagnosis("loss_spike", "loss spike at step 150", "check that batch", 0.9, "loss x4",
        ...               "train/loss", [150])
        >>> f.level
        'high'
    """

    check: str
    title: str
    advice: str
    confidence: float
    why: str
    metric: str
    steps: List[int]
    ranks: List[int] = field(default_factory=list)
    evidence: Dict[str, Any] = field(default_factory=dict)

    @property
    def level(self) -> str:
        return "high" if self.confidence >= 0.75 else "medium" if self.confidence >= 0.45 else "low"


@dataclass
class Report:
    """What ``diagnose`` found in one run; ``to_text`` / ``to_dict`` render it.

    Example:
        >>> report = diagnose(run)
        >>> [f.check for f in report.findings]
        ['loss_spike']
        >>> report.skipped
        {'rank_outlier': 'only one rank in this run (no per-rank local losses)'}
    """

    run_dir: str
    run_name: str
    ranks: List[int]
    steps: Tuple[int, int]
    checks: List[str] = field(default_factory=list)
    findings: List[Diagnosis] = field(default_factory=list)
    skipped: Dict[str, str] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    events: List[Dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        for f, d in zip(self.findings, out["findings"]):
            d["level"] = f.level
        return out

    def to_text(self) -> str:
        head = (f"msbridge diagnose: {self.run_dir}\n  run {self.run_name}, {len(self.ranks)} rank(s), "
                f"steps {self.steps[0]}-{self.steps[1]}")
        lines = [head] + [f"  note: {n}" for n in self.notes]
        if self.findings:
            lines.append(f"\nfindings ({len(self.findings)}):")
            for f in self.findings:
                lines += [f"  [{f.level} {f.confidence:.2f}] {f.title}", f"      {f.advice}",
                          f"      confidence: {f.why}"]
        else:
            lines.append(f"\nno findings: {len(self.checks)} check(s) ran ({', '.join(self.checks) or 'none'})"
                         " and saw nothing unusual.")
        for check, reason in self.skipped.items():
            lines.append(f"  skipped {check}: {reason}")
        if self.events:
            lines.append(f"\nevents recorded during training ({len(self.events)}):")
            lines += [f"  step {e['step']} rank {e['rank']}: {e['kind']} {e['detail']}" for e in self.events[:20]]
            if len(self.events) > 20:
                lines.append(f"  ... and {len(self.events) - 20} more (--format json lists them all)")
        return "\n".join(lines)
