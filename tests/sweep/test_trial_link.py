"""The trial's side: values into the run's config, the objective reported at its step, Optuna's prune stops
training (MindSpore's request_stop; msbridge.track's should_stop), and the run ends PRUNED; a user's own
``study.optimize`` with ``BridgeMonitor(config, trial=trial)`` prunes the same way."""
from __future__ import annotations

import json
import math

import pytest
from helpers.training import OutputRecorder, train_regression

import msbridge
import msbridge.sweep
from msbridge import BridgeMonitor
from msbridge.sinks.base import Record
from msbridge.sinks.runlog import read_run
from msbridge.sweep import ENV_NAMES, current, with_values
from msbridge.sweep.trial import RUN_DIR_ATTR, TrialLink, join_trial, read_outcome, trial_value

optuna = pytest.importorskip("optuna", reason="the sweep extra: pip install 'msbridge[sweep]'")

optuna.logging.set_verbosity(optuna.logging.WARNING)


def records(*pairs):
    return [Record(step, 0, 0.0, {"eval/loss": value}) for step, value in pairs]


def test_outside_a_sweep_nothing_joins(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    assert current() == {} and join_trial() is None
    assert with_values({"optimizer": {"learning_rate": 0.003, "wd": 0.1}, "model": 3},
                       {"optimizer.learning_rate": 0.01, "model.hidden": 64, "seed": 2}) == \
        {"optimizer": {"learning_rate": 0.01, "wd": 0.1}, "model": {"hidden": 64}, "seed": 2}


def test_a_worse_trial_is_pruned_at_the_step_optuna_says(monkeypatch):
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    first = TrialLink(study.ask())
    assert [first.report(records((5, 2.0)), "eval/loss"), first.report(records((10, 1.5)), "eval/loss")] == \
        [False, False]
    study.tell(first.trial, 1.5)
    second = TrialLink(study.ask({"lr": optuna.distributions.FloatDistribution(0.1, 1.0)}))
    assert second.overrides() == [f"params.lr={json.dumps(second.trial.params['lr'])}",
                                  f'sweep_id="{study.study_name}"']
    assert not second.report(records((5, 1.9), (6, 1.8)), "train/loss")  # another metric: nothing reported
    assert not second.report(records((5, 1.9)), "eval/loss")  # better than the median at 5
    assert second.report(records((10, 1.7)), "eval/loss")  # worse at 10: prune
    assert (second.pruned_at, second.pruned_value, second.reported) == (10, 1.7, 2)
    assert not second.report(records((15, 9.0)), "eval/loss")  # said once
    assert second.trial.storage.get_trial(second.trial._trial_id).intermediate_values == {5: 1.9, 10: 1.7}
    event = second.event(0, "eval/loss")
    assert (event.kind, event.step, event.detail["trial"], event.detail["value"]) == ("pruned", 10, 1, 1.7)


def test_a_nan_objective_is_pruned_not_ranked():
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    first = TrialLink(study.ask())
    first.report(records((5, 2.0)), "eval/loss")
    study.tell(first.trial, 2.0)
    bad = TrialLink(study.ask())
    assert bad.report(records((5, math.nan)), "eval/loss") and bad.pruned_at == 5


def test_a_storage_gone_away_leaves_training_unpruned(tmp_path, caplog):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/o.db")
    link = TrialLink(study.ask())
    study._storage = None  # what a vanished database leaves: every call raises
    link.trial.storage = None
    with caplog.at_level("WARNING", "msbridge"):
        assert not link.report(records((5, 2.0)), "eval/loss")
        assert not link.report(records((10, 2.0)), "eval/loss")
    assert link.pruned_at is None
    assert sum("could not be reached" in r.message for r in caplog.records) == 1


def _config(tmp_path, name):
    return {"experiment": "own-study", "run_name": name, "output_dir": str(tmp_path / "{experiment}" / "{run_name}"),
            "flush_steps": 4, "sinks": ["jsonl"], "objective": {"metric": "train/loss"}}


@pytest.mark.slow
def test_a_users_own_study_optimize_prunes_through_the_monitor(tmp_path):
    """Trial 0 learns; trial 1 (learning rate 0) does not and is pruned at its first report, step 4: training
    stops there (MindSpore ran 4 steps of 24), run.json says PRUNED, Optuna PRUNED, the jsonl holds steps 1-4.
    Trial 2's learning rate makes the loss blow up to inf/NaN: pruned too, never the best."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/optuna.db", study_name="own",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    study.enqueue_trial({"lr": 0.01})
    study.enqueue_trial({"lr": 0.0})
    study.enqueue_trial({"lr": 1.0e4})
    seen = {}

    def objective(trial):
        lr = trial.suggest_float("lr", 0.0, 1.0e4)
        monitor = BridgeMonitor(_config(tmp_path, f"t{trial.number}"), progress=False, trial=trial)
        recorder = OutputRecorder()
        seen[trial.number] = (monitor, recorder)
        train_regression([monitor, recorder], steps=24, learning_rate=lr)
        return trial_value(monitor)

    study.optimize(objective, n_trials=3)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED", "PRUNED"]
    assert study.best_trial.number == 0 and len(seen[2][1].steps) < 24
    (good, good_steps), (pruned, pruned_steps) = seen[0], seen[1]
    assert len(good_steps.steps) == 24 and pruned_steps.steps == [1, 2, 3, 4]
    assert pruned.outcome.status == "PRUNED" and pruned.outcome.exit_code == 0
    outcome = read_outcome(pruned.run_dir)
    assert (outcome["status"], outcome["last step"]) == ("PRUNED", 4)
    log = read_run(pruned.run_dir).ranks[0]
    assert [r.step for r in log.records if "train/loss" in r.values] == [1, 2, 3, 4]
    assert [(e.kind, e.step) for e in log.events] == [("pruned", 4)]
    assert pruned.config.params["lr"] == 0.0 and pruned.config.sweep_id == "own"
    assert study.trials[0].value == pytest.approx(read_outcome(good.run_dir)["objective"]["best"])
    assert study.trials[1].user_attrs[RUN_DIR_ATTR] == pruned.run_dir


def test_track_reads_a_prune_as_should_stop(tmp_path):
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    study.add_trial(optuna.trial.create_trial(value=0.5, intermediate_values={4: 1.0, 8: 0.5}))
    trial = study.ask()
    with msbridge.track(_config(tmp_path, "tracked"), trial=trial, total_steps=20, progress=False) as run:
        for step in range(1, 21):
            run.step(loss=5.0)
            if run.should_stop:
                break
    assert step == 4 and run.outcome.status == "PRUNED"
    assert read_outcome(run.run_dir)["status"] == "PRUNED"
    with pytest.raises(optuna.TrialPruned):
        trial_value(run.monitor)
