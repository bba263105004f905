"""``msbridge sweep``'s loop: ask Optuna for a trial, run the training command as its own process, tell the result.

``jobs`` threads each run one trial process at a time. A trial is its command with ``--name=value`` appended
and the ``MSBRIDGE_SWEEP_*`` environment (``msbridge.sweep``); its output goes to
``<experiment dir>/trials/trial-<number>.log``. When it exits, its run's run.json (the run dir the trial's monitor
kept on the Optuna trial) says how it ended:

- PRUNED: told PRUNED (the monitor reported each value and stopped training when Optuna said prune);
- FINISHED with a finite objective: told its objective's best value (what ``msbridge compare`` ranks on);
- anything else (the command failed, no msbridge run, no finite objective): told FAIL, with one line saying why;
  the sweep goes on.

``trials`` is the number the study holds when the sweep is done. The sweep that starts a study reserves them at once
as Optuna's WAITING trials; every worker (this host's ``jobs`` and each ``--join`` on other hosts, through one
storage) takes the next WAITING trial atomically (Optuna's row lock) and samples its values then, so the study
ends with exactly ``trials``, none run twice. A rerun of a killed sweep resumes the study (trials it left RUNNING
are told FAIL first; the WAITING ones are run). ``timeout`` stops new trials from starting; those left WAITING
run when the sweep is run again.

Example (``msbridge sweep sweep.yaml`` does this)::

    summary = run_sweep(load_spec("sweep.yaml"))
    print(summary.line())   # study demo-sweep: 12 trials (COMPLETE 9, PRUNED 3); this sweep ran 12; best: ...
"""
from __future__ import annotations

import json
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, TextIO, Tuple

from ..errors import MsbridgeError, exception_text
from ..masking import mask_text
from . import (ENV_DEVICE, ENV_EXPERIMENT_DIR, ENV_OBJECTIVE, ENV_PARAMS, ENV_PRUNER, ENV_STORAGE, ENV_STUDY,
               ENV_TRIAL, ENV_TRIAL_ID)
from .spec import SweepSpec
from .study import distribution, open_study, optuna_module
from .trial import RUN_DIR_ATTR, finite, read_outcome

#: Seconds ``--join`` waits for the study's first worker to reserve its trials.
JOIN_WAIT_S = 60
#: A command word replaced by the Python running the sweep.
PYTHON = "{python}"
#: Characters of a failed trial's last output line quoted in its one-line reason.
REASON_CHARS = 200


@dataclass
class SweepSummary:
    """What a sweep did: the study's trials by state once it ended, the trials this sweep ran, the best.

    Example:
        >>> SweepSummary("s", {"COMPLETE": 3}, ran={"COMPLETE": 3}).line()
        'study s: 3 trials (COMPLETE 3); this sweep ran 3'
    """

    study: str
    counts: Dict[str, int] = field(default_factory=dict)
    ran: Dict[str, int] = field(default_factory=dict)  # the trials this sweep ran, by state
    best: Optional[Tuple[int, float, Dict[str, Any]]] = None  # (number, value, params)

    def line(self) -> str:
        states = ", ".join(f"{state} {n}" for state, n in sorted(self.counts.items()))
        best = f"; best: trial {self.best[0]} = {self.best[1]:.6g} {json.dumps(self.best[2])}" if self.best else ""
        ran = sum(self.ran.values())
        return f"study {self.study}: {sum(self.counts.values())} trials ({states}); this sweep ran {ran}{best}"


def trial_command(spec: SweepSpec, params: Dict[str, Any]) -> List[str]:
    """The training command with the trial's values appended as ``--name=value`` (W&B's convention); the word
    ``{python}`` is this Python (the sweep's own interpreter, as W&B's ``${interpreter}``).

    Example:
        >>> spec = SweepSpec("sweep.yaml", "s1", ("python", "train.py"), {})
        >>> trial_command(spec, {"optimizer.learning_rate": 0.01, "model.hidden": 64})
        ['python', 'train.py', '--optimizer.learning_rate=0.01', '--model.hidden=64']
    """
    words = [sys.executable if word == PYTHON else word for word in spec.command]
    return [*words, *(f"--{name}={value}" for name, value in params.items())]


def trial_env(spec: SweepSpec, trial: Any, device: Optional[str] = None) -> Dict[str, str]:
    """The trial's process environment: this one plus the ``MSBRIDGE_SWEEP_*`` variables; with a ``device``, the
    only one the process sees (Ascend's and CUDA's visibility variables), which MindSpore then numbers 0."""
    env = dict(os.environ)
    if device is not None:
        env.update({"ASCEND_RT_VISIBLE_DEVICES": device, "CUDA_VISIBLE_DEVICES": device, "DEVICE_ID": "0",
                    ENV_DEVICE: device})
    env.update({ENV_STUDY: spec.study, ENV_STORAGE: spec.storage_url, ENV_TRIAL: str(trial.number),
                ENV_TRIAL_ID: str(trial._trial_id), ENV_PARAMS: json.dumps(trial.params),
                ENV_OBJECTIVE: json.dumps({"metric": spec.metric, "mode": spec.mode}),
                ENV_PRUNER: json.dumps(dict(spec.pruner)), ENV_EXPERIMENT_DIR: spec.directory})
    return env


def _last_line(log_path: str) -> str:
    """The last non-empty line of a trial's output, cut to ``REASON_CHARS``."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(max(os.path.getsize(log_path) - 8192, 0))
            lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:REASON_CHARS] if lines else ""


def judge(spec: SweepSpec, code: int, run_dir: Optional[str], log_path: str) -> Tuple[str, Optional[float], str]:
    """``(state, value, reason)`` of an ended trial from its exit code and its run's outcome; state is
    ``COMPLETE``, ``PRUNED`` or ``FAIL``."""
    outcome = read_outcome(run_dir) if run_dir else {}
    status = outcome.get("status")
    if status == "PRUNED":
        return "PRUNED", None, ""
    if code != 0 and status != "FINISHED":
        said = _last_line(log_path)
        return "FAIL", None, f"the command exited {code}" + (f": {said}" if said else "") + f" (log: {log_path})"
    if not run_dir:
        return "FAIL", None, ("the command ran no msbridge monitor (no run dir on the trial): add BridgeMonitor or "
                              f"msbridge.track to the training script (log: {log_path})")
    if status != "FINISHED":
        return "FAIL", None, f"the run ended {status or 'without an outcome'} (see {run_dir}/README.md)"
    objective = outcome.get("objective") or {}
    value = finite(objective.get("best"))
    if value is None or objective.get("metric") != spec.metric:
        fix = ("; if the run does not evaluate, rank it on its training loss with objective: {metric: train/loss} "
               f"in {spec.path}") if spec.metric.startswith("eval/") else ""
        return "FAIL", None, (f"the run recorded no finite {spec.metric} (objective.metric), its objective was "
                              f"{objective.get('metric')!r} (see {run_dir}/README.md){fix}")
    return "COMPLETE", value, ""


class Sweep:
    """One ``msbridge sweep``: ``spec``'s study opened (created or resumed), its trials run ``jobs`` at a time.

    Args:
        spec: the checked sweep file.
        out: where the one line per trial goes.
        join: join a study another ``msbridge sweep`` started (``--join``): run its WAITING trials; the RUNNING ones
            are the other workers', not stale.

    Example (a command that runs no msbridge monitor: its one trial is FAIL, said in one line)::
        >>> import io
        >>> from msbridge.sweep.spec import load_spec
        >>> _ = open("quick.yaml", "w").write('study: quick\\ncommand: "{python} -c pass"\\nparams: {lr: [0.1]}\\n'
        ...                                   'trials: 1\\nexperiment_dir: ./runs/{study}\\n')
        >>> out = io.StringIO()
        >>> Sweep(load_spec("quick.yaml"), out=out).run().line()
        'study quick: 1 trials (FAIL 1); this sweep ran 1'
        >>> print(out.getvalue().splitlines()[-1][:75])
        [msbridge] sweep: trial 0 FAIL: the command ran no msbridge monitor (no run
    """

    def __init__(self, spec: SweepSpec, out: TextIO = sys.stdout, join: bool = False) -> None:
        self.spec, self.out, self.join = spec, out, join
        # the sampler, pruner and storage checked here, before any trial; a joining worker seeds its sampler apart
        self.study = open_study(spec, seed_offset=os.getpid() if join else 0)
        self.distributions = {name: distribution(param) for name, param in spec.params.items()}
        self.states = optuna_module().trial.TrialState
        self.ran: Dict[str, int] = {}
        self._lock = threading.Lock()
        self._deadline: Optional[float] = None
        self._stopping = False
        self._devices: "queue.Queue[str]" = queue.Queue()  # free devices: each running trial holds one
        for device in spec.devices:
            self._devices.put(device)

    def say(self, text: str) -> None:
        with self._lock:
            print(f"[msbridge] sweep: {text}", file=self.out, flush=True)

    def run(self) -> SweepSummary:
        """Run the study's WAITING trials (reserved up to ``trials``) until none is left or ``timeout`` passed."""
        spec = self.spec
        if self.join:
            self._wait_for_trials()
        else:
            self._fail_stale()
            self._reserve()
        waiting = len(self.study.get_trials(deepcopy=False, states=(self.states.WAITING,)))
        held = len(self.study.get_trials(deepcopy=False)) - waiting
        self.say(f"study {spec.study} in {mask_text(spec.storage_url)}: {held} trial(s) held, up to "
                 f"{waiting} to run, {spec.jobs} at once; runs in {spec.directory}")
        self._deadline = time.monotonic() + spec.timeout if spec.timeout else None
        workers = [threading.Thread(target=self._work, name=f"msbridge-sweep-{i}", daemon=True)
                   for i in range(spec.jobs)]
        for worker in workers:
            worker.start()
        try:
            for worker in workers:
                while worker.is_alive():
                    worker.join(0.5)
        except KeyboardInterrupt:  # the trials' processes got the Ctrl-C too: they end KILLED and are told FAIL
            self._stopping = True
            self.say("interrupted: no new trials; waiting for the running ones to end")
            for worker in workers:
                worker.join(120)
            raise
        return self.summary()

    def _fail_stale(self) -> None:
        """Trials a killed sweep left RUNNING are told FAIL: without ``--join``, this is the study's only worker."""
        for trial in self.study.get_trials(deepcopy=False, states=(self.states.RUNNING,)):
            self._tell(trial.number, state=self.states.FAIL, skip_if_finished=True)
            self.say(f"trial {trial.number} was left RUNNING by a sweep that ended: told FAIL")

    def _reserve(self) -> None:
        """Add WAITING trials (their values sampled when one is taken) until the study holds ``trials``."""
        waiting = optuna_module().trial.create_trial(state=self.states.WAITING)  # no fixed values: grid assigns
        for _ in range(self.spec.trials - len(self.study.get_trials(deepcopy=False))):
            self.study.add_trial(waiting)

    def _wait_for_trials(self) -> None:
        """``--join``: wait up to ``JOIN_WAIT_S`` for the starting sweep to reserve the study's trials."""
        give_up = time.monotonic() + JOIN_WAIT_S
        while not self.study.get_trials(deepcopy=False):
            if time.monotonic() >= give_up:
                raise MsbridgeError(f"--join: the study {self.spec.study} holds no trials after {JOIN_WAIT_S} s; "
                                    f"start it first: msbridge sweep {self.spec.path} (without --join)")
            time.sleep(1.0)

    def _next(self) -> Any:
        """The next WAITING trial, taken for this worker with its values sampled now, or None when none is left."""
        with self._lock:
            if self._stopping or (self._deadline is not None and time.monotonic() >= self._deadline):
                return None
            storage = self.study._storage
            for waiting in self.study.get_trials(deepcopy=False, states=(self.states.WAITING,)):
                try:  # True for exactly one worker: the row is locked, and a taken trial is no longer WAITING
                    taken = storage.set_trial_state_values(waiting._trial_id, state=self.states.RUNNING)
                except optuna_module().exceptions.UpdateFinishedTrialError:
                    taken = False
                if taken:
                    return self._sample(waiting)
            return None

    def _sample(self, taken: Any) -> Any:
        """The taken trial with its values sampled; a sampler that fails is FAIL, said, and ends this sweep."""
        trial = optuna_module().Trial(self.study, taken._trial_id)
        try:
            for name, dist in self.distributions.items():
                trial._suggest(name, dist)  # what Study.ask(fixed_distributions) does
        except Exception as exc:
            self._tell(trial, state=self.states.FAIL, skip_if_finished=True)
            self._stopping = True
            print(f"[msbridge] sweep: trial {taken.number} FAIL: the sampler could not sample it: "
                  f"{exception_text(exc)}; no new trials", file=self.out, flush=True)
            return None
        return trial

    def _work(self) -> None:
        while True:
            try:
                trial = self._next()
            except Exception as exc:  # the storage went away: said once per worker, no traceback
                self._stopping = True
                self.say(f"the study's storage failed: {exception_text(exc)}; no new trials")
                return
            if trial is None:
                return
            try:
                state = self._run_trial(trial)
            except Exception as exc:  # never lose a trial: whatever failed here, Optuna hears FAIL
                self._tell(trial, state=self.states.FAIL, skip_if_finished=True)
                self.say(f"trial {trial.number} FAIL: {type(exc).__name__}: {exc}")
                state = "FAIL"
            with self._lock:
                self.ran[state] = self.ran.get(state, 0) + 1

    def _tell(self, trial: Any, value: Optional[float] = None, **how: Any) -> None:
        """``study.tell``. A sampler that stops the study once told (the grid sampler, its grid done) ends this
        sweep's new trials: Optuna's ``Study.stop`` raises outside its own optimize loop, after the trial's state
        is stored."""
        try:
            self.study.tell(trial, value, **how)
        except RuntimeError as exc:
            if "Study.stop" not in str(exc):
                raise
            self._stopping = True

    def _run_trial(self, trial: Any) -> str:
        """Run one trial's process to its end, then tell Optuna how it went; returns the state told."""
        spec, number = self.spec, trial.number
        log_dir = os.path.join(spec.directory, "trials")
        os.makedirs(log_dir, exist_ok=True)
        log_path = os.path.join(log_dir, f"trial-{number}.log")
        started = time.monotonic()
        code, why = self._process(trial, log_path)
        if code is None:
            state, value, reason = "FAIL", None, why
        else:
            stored = self.study._storage.get_trial(trial._trial_id)
            state, value, reason = judge(spec, code, stored.user_attrs.get(RUN_DIR_ATTR), log_path)
            if state == "PRUNED" and stored.last_step is not None:
                reason = f"at step {stored.last_step}, {spec.metric}={stored.intermediate_values[stored.last_step]:.6g}"
        if state == "FAIL":
            trial.set_user_attr("msbridge.fail_reason", reason)
        told = {"COMPLETE": None, "PRUNED": self.states.PRUNED, "FAIL": self.states.FAIL}[state]
        self._tell(trial, value if state == "COMPLETE" else None, state=told)
        took = time.monotonic() - started
        self.say(f"trial {number} {state}" + (f" {spec.metric}={value:.6g}" if value is not None else "") +
                 (f": {reason}" if state == "FAIL" else f" {reason}" if reason else "") + f" ({took:.0f} s)")
        return state

    def _process(self, trial: Any, log_path: str) -> Tuple[Optional[int], str]:
        """Run the trial's command to its end, holding a device of ``devices`` meanwhile; its exit code, or None and
        why it could not start."""
        spec = self.spec
        command = trial_command(spec, trial.params)
        device = self._devices.get() if spec.devices else None
        self.say(f"trial {trial.number} started" + (f" on device {device}" if device is not None else "") +
                 f": {shlex.join(command[len(spec.command):])}")
        try:
            with open(log_path, "wb") as log:
                return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=trial_env(spec, trial, device)).returncode, ""
        except OSError as exc:  # no such program, no permission
            return None, f"cannot start {command[0]!r}: {exc.strerror or exc}"
        finally:
            if device is not None:
                self._devices.put(device)

    def summary(self) -> SweepSummary:
        """The study's trials by state now, what this sweep ran, and the best complete trial."""
        counts: Dict[str, int] = {}
        for trial in self.study.get_trials(deepcopy=False):
            counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
        best = None
        if counts.get("COMPLETE"):
            top = self.study.best_trial
            best = (top.number, float(top.value), dict(top.params))
        return SweepSummary(self.spec.study, counts, dict(self.ran), best)


def run_sweep(spec: SweepSpec, out: TextIO = sys.stdout, join: bool = False) -> SweepSummary:
    """Run the sweep ``spec`` describes (``Sweep``) and return its summary."""
    return Sweep(spec, out, join).run()
