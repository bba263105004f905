"""Which parameters ``layer_norms`` names, and under which name each is reported: itself, or its layer.

``layer_norms`` is a regex (``re.search``) over parameter names. Without
``layer_norms_group`` every matched parameter is one series
(``grad_norm/<param>``). With it, a regex whose one capturing group names the
layer (``layers\\.(\\d+)\\.`` or ``(model\\.layers\\.\\d+)\\.``), the parameters of one
layer are one series, ``grad_norm/<group>``: the L2 norm of all their values
together, sqrt of the sum of their squared norms. A matched parameter the group
regex does not match keeps its own series (embeddings, the final norm).

Cost in MLflow: every series is one metric row per recorded step (grad norms)
or per flush (weight and optimizer norms). 300 matched parameters, every step
recorded: 300 rows a step for the grad norms, plus 900 rows a flush for the
weights and two Adam moments; grouped into 24 layers: 24 and 72.

Example:
    >>> sel = ParamSelector(".*", r"layers\\.(\\d+)\\.").select(["emb.w", "layers.0.q", "layers.0.k", "layers.1.q"])
    >>> sel.labels
    ('emb.w', '0', '1')
    >>> sel.reduce(np.array([[1.0, 3.0, 4.0, 2.0]]))
    array([[1., 5., 2.]])
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..limits import compile_user_regex


@dataclass(frozen=True)
class Selection:
    """The matched parameters of one name list and how they fold into reported series.

    Attributes:
        indices: positions of the matched parameters in the name list.
        labels: the reported names, in first-seen order (a parameter's name or its layer's).
        members: for each label, positions into ``indices`` of the parameters it sums.
    """

    indices: Tuple[int, ...]
    labels: Tuple[str, ...]
    members: Tuple[Tuple[int, ...], ...]

    @property
    def grouped(self) -> bool:
        return len(self.labels) != len(self.indices)

    def reduce(self, norms: np.ndarray, picked: bool = False) -> np.ndarray:
        """Per-label norms from per-parameter norms (last axis: the full name list, or with ``picked``
        only the matched parameters, in ``indices`` order)."""
        picked = np.asarray(norms, dtype=np.float64) if picked else \
            np.asarray(norms, dtype=np.float64)[..., list(self.indices)]
        if not self.grouped:
            return picked
        squares = np.square(picked)
        return np.stack([np.sqrt(squares[..., list(m)].sum(axis=-1)) for m in self.members], axis=-1)

    def named(self, prefix_name: Callable[[str], str], norms: np.ndarray,
              picked: bool = False) -> Dict[str, np.ndarray]:
        """``{prefix_name(label): column}`` of ``reduce(norms, picked)`` (a column per label)."""
        reduced = self.reduce(norms, picked)
        return {prefix_name(label): reduced[..., i] for i, label in enumerate(self.labels)}


class ParamSelector:
    """``layer_norms`` and ``layer_norms_group`` compiled once; ``select`` applies them to a name list.

    Args:
        pattern: regex over parameter names (``re.search``).
        group: optional regex with one capturing group naming the layer.

    Example:
        >>> ParamSelector("attention").select(["l0.attention.wq", "l0.ffn.w1"]).labels
        ('l0.attention.wq',)
    """

    def __init__(self, pattern: str, group: Optional[str] = None) -> None:
        self.pattern = pattern
        self.regex = compile_user_regex(pattern)
        self.group = compile_user_regex(group) if group else None
        if self.group is not None and self.group.groups != 1:
            raise ValueError(f"layer_norms_group {group!r} must have exactly one capturing group "
                             f"(it has {self.group.groups})")

    def select(self, names: Sequence[str]) -> Selection:
        indices: List[int] = []
        labels: Dict[str, List[int]] = {}
        for i, name in enumerate(names):
            if not self.regex.search(name):
                continue
            found = self.group.search(name) if self.group is not None else None
            label = found.group(1) if found is not None and found.group(1) else name
            labels.setdefault(label, []).append(len(indices))
            indices.append(i)
        return Selection(tuple(indices), tuple(labels), tuple(tuple(m) for m in labels.values()))

    def no_match(self, names: Sequence[str], what: str = "parameter", setting: str = "layer_norms") -> str:
        """The warning for a regex that matches none of ``names``, naming the closest ones."""
        close = difflib.get_close_matches(self.pattern, list(names), n=3, cutoff=0.0)
        shown = ", ".join(map(repr, close)) if close else "(the model has none)"
        return (f"msbridge: {setting} {self.pattern!r} matches no {what} name (re.search); "
                f"the closest of the {len(names)} names: {shown}")
