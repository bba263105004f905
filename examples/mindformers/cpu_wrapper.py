"""A mindformers train-step wrapper that runs on CPU: ``CPUTrainOneStepCell``.

mindformers' ``MFTrainOneStepCell`` inherits MindSpore's overflow check from
``nn.TrainOneStepWithLossScaleCell.get_overflow_status``. On a non-GPU target that check
uses ``NPUGetFloatStatusV2`` / ``NPUClearFloatStatusV2`` (Ascend only); the GPU branch uses
``FloatStatus``. Neither has a CPU kernel, so graph compilation fails on CPU.

This subclass replaces only ``get_overflow_status``: "overflow" means some gradient holds
an inf or NaN, found with ``IsFinite`` + ``ReduceAll``. Everything else (loss scaling, grad
clipping with ``global_norm``, the ``(loss, overflow, loss_scale, lr, global_norm)``
outputs, local norm) is mindformers' own code.

Importing this module registers the class as a mindformers WRAPPER, so a run YAML can say::

    runner_wrapper:
      type: CPUTrainOneStepCell
      use_clip_grad: True

Registering is a dict assignment keyed by class name, so importing twice (or reloading)
only replaces the entry with an identical class.
"""
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
from mindformers.wrapper.wrapper import MFTrainOneStepCell
from mindspore import Tensor, ops
from mindspore.common import dtype as mstype

__all__ = ["CPUTrainOneStepCell"]

_grad_not_finite = ops.MultitypeFuncGraph("_cpu_grad_not_finite")
_is_finite = ops.IsFinite()
_reduce_all = ops.ReduceAll(keep_dims=False)
_cast = ops.Cast()


@_grad_not_finite.register("Tensor")
def _tensor_not_finite(grad):
    """1.0 if ``grad`` holds an inf or NaN, else 0.0 (float32 scalar)."""
    return Tensor(1.0, mstype.float32) - _cast(_reduce_all(_is_finite(grad)), mstype.float32)


@_grad_not_finite.register("RowTensor")
def _row_tensor_not_finite(grad):
    return Tensor(1.0, mstype.float32) - _cast(_reduce_all(_is_finite(grad.values)), mstype.float32)


@MindFormerRegister.register(MindFormerModuleType.WRAPPER)
class CPUTrainOneStepCell(MFTrainOneStepCell):
    """``MFTrainOneStepCell`` with an overflow check that has CPU kernels.

    Takes the same arguments as ``MFTrainOneStepCell`` and returns the same outputs:
    ``(loss, overflow, loss_scale, learning_rate, global_norm)``, or 7 items with
    ``local_norm=True``.
    """

    def get_overflow_status(self, status, compute_output):
        """True if any gradient in ``compute_output`` is not finite (summed over ranks when distributed)."""
        flags = self.hyper_map(ops.partial(_grad_not_finite), compute_output)
        flag_sum = ops.AddN()(flags)
        flag_sum = ops.Reshape()(flag_sum, ())
        if self.is_distributed:
            flag_sum = self.allreduce(flag_sum)
        return self.less_equal(self.base, flag_sum)
