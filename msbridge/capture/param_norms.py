"""L2 norms of parameter-shaped state read at a flush: the weights, and the Adam-family moments.

``StateNorms`` computes the norms of a fixed list of tensors. Where the tensors
live in host memory (the CPU backend) it reads each in place and takes the norm
with numpy (~1 ms for 100 small parameters); on a device it runs one compiled
cell that returns every norm in one small tensor, so one launch and one
device->host copy of ``n`` floats per flush, never a copy of the weights.

``optimizer_states`` finds the two Adam moments under the names MindSpore and
mindformers give them (``moment1``/``moment2``: ``nn.Adam``; ``moments1``/``moments2``:
``nn.AdamWeightDecay``; ``exp_avg``/``exp_avg_sq``: mindformers' AdamW), as
mindformers' TrainingStateMonitor does; each is aligned with ``optimizer.parameters``.

Example:
    >>> norms = StateNorms(net.trainable_params())
    >>> norms.read()          # one float per parameter
    array([3.1, 0.4])
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

#: (first moment, second moment) attribute names, in the order mindformers looks for them.
MOMENT_ATTRIBUTES = (("moment1", "moment2"), ("moments1", "moments2"), ("exp_avg", "exp_avg_sq"))


def optimizer_states(optimizer: Any) -> Dict[str, Sequence[Any]]:
    """``{"adam_m": [...], "adam_v": [...]}`` aligned with ``optimizer.parameters``, or ``{}``.

    Example:
        >>> sorted(optimizer_states(nn.Adam(net.trainable_params())))
        ['adam_m', 'adam_v']
    """
    params = getattr(optimizer, "parameters", None)
    for first, second in MOMENT_ATTRIBUTES:
        m, v = getattr(optimizer, first, None), getattr(optimizer, second, None)
        if m is not None and v is not None and params is not None and len(m) == len(v) == len(params):
            return {"adam_m": list(m), "adam_v": list(v)}
    return {}


def _compiled_norms(tensors: Sequence[Any]) -> Any:
    """A cell returning the stacked L2 norms of ``tensors`` (float32), built on first use."""
    import mindspore as ms
    from mindspore import ParameterTuple, nn, ops

    norm = ops.MultitypeFuncGraph("msbridge_state_norm")

    @norm.register("Tensor")
    def _norm(value: Any) -> Any:
        return ops.sqrt(ops.square(ops.cast(value, ms.float32)).sum())

    class Norms(nn.Cell):
        def __init__(self) -> None:
            super().__init__(auto_prefix=False)
            self.states = ParameterTuple(tensors)
            self.hyper_map = ops.HyperMap()

        def construct(self) -> Any:
            return ops.stack(self.hyper_map(norm, self.states))

    return Norms()


def host_values(tensor: Any) -> np.ndarray:
    """A tensor's values on the host, flat (float16/float32 read in place on the CPU backend, copied
    from a device; bfloat16 cast to float32 first)."""
    try:
        values = tensor.asnumpy()
    except TypeError:  # a dtype numpy has not got (bfloat16)
        import mindspore as ms

        values = tensor.astype(ms.float32).asnumpy()
    return values.reshape(-1)


def _host_norm(tensor: Any) -> float:
    """The norm of a tensor in host memory."""
    return float(np.linalg.norm(host_values(tensor).astype(np.float32, copy=False)))


class StateNorms:
    """The L2 norm of each tensor in a fixed list, read at a flush.

    Args:
        tensors: Parameters (weights or optimizer moments).
        on_host: read them in place with numpy (the CPU backend); None: decide from the device target.

    Example:
        >>> StateNorms(opt.moment1).read().shape
        (10,)
    """

    def __init__(self, tensors: Sequence[Any], on_host: Optional[bool] = None) -> None:
        self.tensors = list(tensors)
        if on_host is None:
            import mindspore as ms

            on_host = ms.get_context("device_target") == "CPU"
        self.on_host = on_host
        self._cell: Any = None

    def __len__(self) -> int:
        return len(self.tensors)

    def read(self) -> np.ndarray:
        if not self.tensors:
            return np.zeros(0)
        if self.on_host:
            return np.array([_host_norm(t) for t in self.tensors], dtype=np.float64)
        if self._cell is None:
            self._cell = _compiled_norms(self.tensors)
        return self._cell().asnumpy().astype(np.float64)
