"""mindformers' max attention logits forwarded as ``attention/max_logit/*`` (``msbridge.mindformers.attention``).

The model is a real mindformers ``parallel_core`` one (a 2-layer ``TrainingTeleChat3ForCausalLM``) with
``track_max_attention_logit`` on, as mindformers' Trainer builds it for ``max_attention_logit_format``, and
TrainingStateMonitor, MSBridgeMonitor and MaxLogitsMonitor run at each step end in the order mindformers'
Trainer sorts them. Its forward cannot run on CPU: the logits come from ``FlashAttentionScore``, which has no
CPU kernel, and mindformers' training-graph attention is always FlashAttention. So each step here writes the
per-head values into the layers' ``max_logits_val`` Parameters, where FlashAttention would have put them;
everything after that is mindformers' own code, and TrainingStateMonitor's TensorBoard output is the oracle.
"""
from __future__ import annotations

import glob
import os
from types import SimpleNamespace
from typing import Dict, List, Tuple

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train.callback import RunContext, _InternalCallbackParam

pytest.importorskip("mindformers")

from helpers.mlflow_reads import mlflow_series  # noqa: E402
from helpers.mlflow_reads import only_run as only_mlflow_run  # noqa: E402
from mindformers import __version__ as MF_VERSION  # noqa: E402
from mindformers.tools.register.template import MonitorConfig  # noqa: E402

from msbridge.names import MAX_LOGIT_MAX, MAX_LOGIT_MEAN, max_logit_name  # noqa: E402
from msbridge.sinks.runlog import read_run  # noqa: E402

HAS_KEY = "max_attention_logit_format" in vars(MonitorConfig)
needs_logits = pytest.mark.skipif(not HAS_KEY, reason=f"mindformers {MF_VERSION} has no monitor_config."
                                  "max_attention_logit_format (1.6 and 1.7 lack it), nor MaxLogitsMonitor and the "
                                  "parallel_core models that track attention logits")

HEADS = 4
LAYERS = ("decoder.layers.0.self_attention.core_attention", "decoder.layers.1.self_attention.core_attention")
# the per-head logits of each step, per layer
LOGITS = {step: np.random.default_rng(step).uniform(0.5, 30.0, (len(LAYERS), HEADS)).astype(np.float32)
          for step in range(1, 5)}


@pytest.fixture
def mcore_context():
    """mindformers' context with ``use_legacy: False`` (its parallel_core models need it), restored afterwards."""
    from mindformers.core.context.build_context import MFContextOperator, build_mf_context

    saved = MFContextOperator._instance  # a singleton: built once per process unless reset
    MFContextOperator.reset_instance()
    build_mf_context({"use_legacy": False})
    yield
    MFContextOperator._instance = saved


def tiny_model():
    """A 2-layer mindformers TeleChat3 training model that tracks its max attention logits."""
    from mindformers.models.telechat3.configuration_telechat3 import TeleChat3Config
    from mindformers.models.telechat3.modeling_telechat3_train import TrainingTeleChat3ForCausalLM

    config = TeleChat3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=8,
                             max_position_embeddings=16, seq_length=16, compute_dtype="float32",
                             params_dtype="float32", track_max_attention_logit=True)
    return TrainingTeleChat3ForCausalLM(config)


def step_params(cb: _InternalCallbackParam, step: int) -> None:
    scalar = Tensor(0.0, ms.float32)
    cb.cur_step_num, cb.cur_epoch_num = step, 1
    cb.net_outputs = (Tensor(2.0 / (step + 1), ms.float32), Tensor(False), Tensor(1.0, ms.float32), scalar,
                      Tensor([1.0], ms.float32))


def run_steps(tmp_path) -> None:
    """Four step ends of TrainingStateMonitor, MSBridgeMonitor (flush every 2 steps) and MaxLogitsMonitor, in the
    order mindformers' Trainer sorts them, with mindformers' tensorboard writer on."""
    from mindformers.core.callback.callback import MaxLogitsMonitor, TrainingStateMonitor
    from mindformers.trainer.base_trainer import BaseTrainer
    from mindformers.utils.tensorboard import _set_tensorboard_writer, _unset_tensorboard_writer

    from msbridge.mindformers import MSBridgeMonitor

    model = tiny_model()
    attentions = [model.model.decoder.layers[i].self_attention.core_attention for i in range(len(LAYERS))]
    _set_tensorboard_writer(SimpleNamespace(tensorboard_dir=str(tmp_path / "mf_tb")))
    try:
        state = TrainingStateMonitor(origin_epochs=1, dataset_size=4, tensor_model_parallel_size=1,
                                     config={"max_attention_logit_format": "tensorboard"})
        # msbridge's tensorboard sink writes through mindformers' writer, as in a run with `tensorboard:`
        ours = MSBridgeMonitor(experiment="logits", output_dir=str(tmp_path / "runs/{experiment}/{run_name}"),
                               sinks=["jsonl", "tensorboard", "mlflow"], flush_steps=2, flush_seconds=3600)
        # as the Trainer lists them: the run YAML's callbacks (TrainingStateMonitor added from monitor_config), then
        # MaxLogitsMonitor
        callbacks = BaseTrainer.sort_callbacks([ours, state, MaxLogitsMonitor()])
        assert [type(c).__name__ for c in callbacks] == ["TrainingStateMonitor", "MSBridgeMonitor", "MaxLogitsMonitor"]
        cb = _InternalCallbackParam()
        cb.train_network = cb.network = nn.TrainOneStepCell(model, nn.SGD(model.trainable_params(), 0.1))
        cb.list_callback, cb.optimizer, cb.dataset_sink_mode, cb.batch_num, cb.epoch_num = callbacks, None, False, 4, 1
        context = RunContext(cb)
        step_params(cb, 0)
        ours.on_train_begin(context)
        for step in range(1, 5):
            step_params(cb, step)
            for layer, attention in enumerate(attentions):  # what FlashAttention leaves after the step's forward
                attention.max_logits_val.set_data(Tensor(LOGITS[step][layer]))
            for callback in callbacks:
                callback.on_train_step_end(context)
            assert all(not a.max_logits_val.asnumpy().any() for a in attentions), "MaxLogitsMonitor reset them"
        ours.on_train_end(context)
    finally:
        _unset_tensorboard_writer()


def read_tensorboard(logdir: str) -> Tuple[Dict[str, Dict[int, float]], Dict[str, Dict[int, List[float]]]]:
    """The scalars of ``logdir``'s own event file by tag and step, and TrainingStateMonitor's per-head logits
    (written with ``add_scalars``: one directory per head, its name ending in ``head_<i>``) by layer and step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    main = EventAccumulator(logdir, size_guidance={"scalars": 0})
    main.Reload()
    scalars = {tag: {e.step: e.value for e in main.Scalars(tag)} for tag in main.Tags()["scalars"]}
    per_head: Dict[str, Dict[int, List[float]]] = {}
    for head_dir in [d for d in glob.glob(os.path.join(logdir, "**", "*head_*"), recursive=True) if os.path.isdir(d)]:
        ea = EventAccumulator(head_dir, size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            layer = tag[len("max_attention_logit/"):-len(".max_logits_val")]
            for e in ea.Scalars(tag):
                per_head.setdefault(layer, {}).setdefault(e.step, []).append(e.value)
    return scalars, per_head


@needs_logits
def test_max_attention_logits_reach_every_sink_as_mindformers_computes_them(tmp_path, mcore_context):
    from mlflow.tracking import MlflowClient

    run_steps(tmp_path)
    mf, per_head = read_tensorboard(str(tmp_path / "mf_tb"))  # the oracle: TrainingStateMonitor's own tags
    assert sorted(mf["max_attention_logit/max"]) == [1, 2, 3, 4] and sorted(per_head) == sorted(LAYERS)
    assert all(sorted(steps) == [1, 2, 3, 4] and all(len(v) == HEADS for v in steps.values())
               for steps in per_head.values())

    run_dir = next(p for p in glob.glob(str(tmp_path / "runs" / "logits" / "*")) if os.path.isfile(p + "/run.json"))
    records = {r.step: r.values for r in read_run(run_dir).ranks[0].records}
    assert sorted(records) == [1, 2, 3, 4]
    names = [max_logit_name(layer) for layer in LAYERS] + [MAX_LOGIT_MAX, MAX_LOGIT_MEAN]
    flushed = [s for s in sorted(records) if MAX_LOGIT_MAX in records[s]]
    assert flushed == [2, 4], flushed  # read at each flush, from the step just run
    for step in flushed:
        want = {max_logit_name(layer): max(per_head[layer][step]) for layer in LAYERS}
        want[MAX_LOGIT_MAX] = mf["max_attention_logit/max"][step]
        want[MAX_LOGIT_MEAN] = mf["max_attention_logit/mean"][step]
        got = {n: records[step][n] for n in names}
        np.testing.assert_allclose([got[n] for n in names], [want[n] for n in names], rtol=1e-6, err_msg=str(step))
        np.testing.assert_allclose(got[MAX_LOGIT_MAX], LOGITS[step].max(), rtol=1e-7)

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'logits' / 'mlflow.db'}")
    run_id = only_mlflow_run(client, "logits").info.run_id
    for name in names:
        want = [(s, records[s][name]) for s in flushed]
        tb = sorted(mf[name].items())  # msbridge's own tags, in mindformers' event file
        assert [s for s, _ in tb] == flushed and [s for s, _ in mlflow_series(client, run_id, name)] == flushed
        np.testing.assert_allclose([v for _, v in tb], [v for _, v in want], rtol=1e-6, err_msg=name)
        assert mlflow_series(client, run_id, name) == want, name


@needs_logits
def test_a_model_without_logits_is_said_once_and_nothing_is_read(caplog):
    """A model without ``get_max_attention_logit`` (mindformers' legacy models, such as the example's
    LlamaForCausalLM; here a Dense) has no logits to read: one warning."""
    from mindformers.core.callback.callback import TrainingStateMonitor

    from msbridge.mindformers.attention import MaxAttentionLogits

    state = TrainingStateMonitor(origin_epochs=1, dataset_size=4, config={"max_attention_logit_format": "log"})
    net = nn.Dense(2, 2)
    with caplog.at_level("WARNING", logger="msbridge"):
        assert MaxAttentionLogits.from_callbacks([state], nn.TrainOneStepCell(net, nn.SGD(net.trainable_params()))) \
            is None
    assert [r.getMessage() for r in caplog.records if "does not track attention logits" in r.getMessage()] == \
        ["msbridge: monitor_config.max_attention_logit_format is set, but Dense does not track attention logits "
         "(mindformers computes them in the FlashAttention of its parallel_core models only): "
         "no attention/max_logit/* metrics"]


@pytest.mark.compat  # also on the oldest pair, whose mindformers (1.6) has no such key
def test_without_max_attention_logit_format_nothing_is_read_or_said(caplog):
    """Unset, or a mindformers without the key (1.6 and 1.7, whose TrainingStateMonitor ignores it): no reader,
    no warning."""
    from mindformers.core.callback.callback import TrainingStateMonitor

    from msbridge.mindformers.attention import MaxAttentionLogits

    net = nn.Dense(2, 2)
    cell = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params()))
    monitors = [TrainingStateMonitor(origin_epochs=1, dataset_size=4, config={})]
    if not HAS_KEY:
        monitors.append(TrainingStateMonitor(origin_epochs=1, dataset_size=4,
                                             config={"max_attention_logit_format": "log"}))
    with caplog.at_level("WARNING", logger="msbridge"):
        assert [MaxAttentionLogits.from_callbacks([m], cell) for m in monitors] == [None] * len(monitors)
    assert not [r for r in caplog.records if r.name == "msbridge"]


@needs_logits
def test_a_monitor_running_after_the_reset_says_so_once(caplog, mcore_context):
    """``Trainer(callbacks=[monitor])`` puts MSBridgeMonitor after MaxLogitsMonitor, which zeroes the logits."""
    from mindformers.core.callback.callback import MaxLogitsMonitor, TrainingStateMonitor
    from mindformers.trainer.base_trainer import BaseTrainer

    from msbridge.mindformers.attention import MaxAttentionLogits

    state = TrainingStateMonitor(origin_epochs=1, dataset_size=4, config={"max_attention_logit_format": "log"})
    ours = object()
    network = tiny_model()
    callbacks = BaseTrainer.sort_callbacks([state, MaxLogitsMonitor(), ours])
    with caplog.at_level("WARNING", logger="msbridge"):
        assert MaxAttentionLogits.from_callbacks(callbacks, network, ours) is None
    assert [r.getMessage() for r in caplog.records if "MaxLogitsMonitor runs before" in r.getMessage()] == [
        "msbridge: mindformers' MaxLogitsMonitor runs before MSBridgeMonitor and zeroes the max attention logits "
        "at each step end: no attention/max_logit/* metrics. List MSBridgeMonitor under the run YAML's callbacks: "
        "(mindformers adds MaxLogitsMonitor after those), not in Trainer(callbacks=...)"]
    assert MaxAttentionLogits.from_callbacks(BaseTrainer.sort_callbacks([ours, state, MaxLogitsMonitor()]), network,
                                             ours) is not None
