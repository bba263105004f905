"""mindformers' ``do_eval: True`` trained for real: each evaluation its EvalCallBack runs is an ``eval/*`` record.

The run is ``examples/mindformers/train.py`` (the tiny Llama of tiny_llama.yaml) with a run YAML that adds
mindformers' own evaluation keys: ``do_eval``, ``eval_step_interval``, ``metric: {type: PerplexityMetric}`` and an
``eval_dataset``. The reference is mindformers' own log line ``Eval result: {...}`` of each evaluation.

The evaluation data has ``seq_length`` tokens per row where the training data has ``seq_length + 1``: in eval mode
LlamaForCausalLM feeds ``input_ids`` unsliced, so 33 tokens would not fit its 32×32 attention mask.
"""
from __future__ import annotations

import ast
import re
import sys

import pytest

pytest.importorskip("mindformers")

from helpers.mf_runs import EXAMPLE, do_eval_yaml, only_run, train, variant  # noqa: E402

from msbridge.sinks.runlog import read_run  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.compat]  # compat: mindformers 1.6 passes too

EVAL_YAML = do_eval_yaml(5) + """callbacks:
  - type: MFLossMonitor
  - type: CheckpointMonitor
    prefix: tiny
    save_checkpoint_steps: 5
    keep_checkpoint_max: 2
    integrated_save: False
  - type: MSBridgeMonitor
    experiment: tiny-llama
    output_dir: ./msbridge_runs/{experiment}/{run_name}
    sinks: [jsonl, tensorboard, mlflow]
    flush_steps: 5
"""
EVAL_LINE = re.compile(r"Eval result: (\{.*?\}), eval time is ([\d.]+) s")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """10 training steps, an evaluation of 2 batches after steps 5 and 10."""
    tmp = tmp_path_factory.mktemp("mf_eval")
    work = tmp / "work"
    sys.path.insert(0, str(EXAMPLE))
    try:
        from make_data import make_mindrecord
    finally:
        sys.path.remove(str(EXAMPLE))
    make_mindrecord(str(work / "eval"), samples=8, seq_length=31, seed=1)  # rows of 32 tokens
    out = train(work, steps=10, config=variant(tmp, "eval.yaml", EVAL_YAML))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log_text = (work / "output" / "log" / "rank_0" / "info.log").read_text()
    printed = [ast.literal_eval(m[1]) for m in EVAL_LINE.finditer(log_text)]
    return work, only_run(work), printed


def test_each_evaluation_is_recorded_at_its_training_step(evaluated):
    _, run_dir, printed = evaluated
    assert len(printed) == 2, printed  # mindformers itself evaluated twice
    log = read_run(run_dir).ranks[0]
    assert [s for s, _ in log.series("train/loss")] == list(range(1, 11)), "every training step recorded"
    for name in ("loss", "PPL"):
        series = log.series(f"eval/{name}")
        assert [s for s, _ in series] == [5, 10], name
        want = [result["PerplexityMetric"][name] for result in printed]
        assert [v for _, v in series] == pytest.approx(want, rel=1e-6), name
    assert [s for s, _ in log.series("eval/samples")] == [5, 10]
    assert all(v == 8 for _, v in log.series("eval/samples"))
    assert all(v > 0 for _, v in log.series("eval/time_s"))
    assert not [name for name in log.metric_names() if name.startswith("perf/") and "eval" in name]


def test_trackers_hold_the_evaluations(evaluated):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    work, run_dir, printed = evaluated
    want = [result["PerplexityMetric"]["PPL"] for result in printed]
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'msbridge_runs' / 'tiny-llama' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("tiny-llama").experiment_id])[0]
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/PPL"))
    assert [s for s, _ in history] == [5, 10]
    assert [v for _, v in history] == pytest.approx(want, rel=1e-6)
    assert run.data.metrics["objective/best"] == pytest.approx(min(r["PerplexityMetric"]["loss"] for r in printed),
                                                               rel=1e-6)  # the default objective: eval/loss
    tb = EventAccumulator(str(work / "msbridge_runs" / "tiny-llama" / "tensorboard" / run_dir.rsplit("/", 1)[-1]
                              / "rank_0"), size_guidance={"scalars": 0})
    tb.Reload()
    assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in tb.Scalars("eval/PPL")] == list(zip([5, 10], want))


def test_each_checkpointmonitor_file_is_a_logged_model_linked_to_its_evaluation(evaluated):
    from mlflow.tracking import MlflowClient

    work, run_dir, printed = evaluated
    [saved] = [[e for e in read_run(run_dir).ranks[0].events if e.kind == "checkpoint"]]
    assert [e.step for e in saved] == [5, 10] and {e.detail["source"] for e in saved} == {"CheckpointMonitor"}
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'msbridge_runs' / 'tiny-llama' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-llama").experiment_id
    models = client.search_logged_models([experiment], order_by=[{"field_name": "metrics.eval/loss",
                                                                   "ascending": True}])
    assert sorted(int(m.tags["msbridge.step"]) for m in models) == [5, 10]
    for model in models:
        step = int(model.tags["msbridge.step"])
        linked = {m.key: m.value for m in model.metrics}
        assert linked["eval/loss"] == pytest.approx(printed[step // 5 - 1]["PerplexityMetric"]["loss"], rel=1e-6)
    losses = [result["PerplexityMetric"]["loss"] for result in printed]
    assert int(models[0].tags["msbridge.step"]) == 5 * (1 + losses.index(min(losses))), "the best checkpoint first"
