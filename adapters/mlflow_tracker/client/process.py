"""MLflow's client in a child process, so MLflow's CPU never holds the training process's GIL.

MLflow's stores are pure Python (SQLAlchemy: ~1.9 ms of CPU per record of 13 metrics, seconds to create a sqlite
store; a sqlite store's metric rows are written by ``mlflow_tracker.store.rows`` here, ~0.1 ms a record). Run on a thread of the
training process, every millisecond of it costs training about as much: the training thread waits up to the GIL's
switch interval (5 ms) each time it needs the GIL back. In a child process it has its own GIL, and it must use little
CPU: on this project's 2-vCPU VM even an idle-class process using 15% of a core cost training 16-22%, so priority does
not make CPU free, it only decides who waits when the cores are busy. The child starts when the sink is built, before
training; for a sqlite store it never imports MLflow for a run's usual calls (``mlflow_tracker.store.native``), for any other it
imports MLflow on its first call (~2 s of CPU); the tracking URI and MLflow's HTTP limits reach it through its
pipe (``connect``) when the run is known, so nothing secret is on its command line.

Priority: the child is niced, then idle-class, beside a live training, and ``hurry`` hands a starved one over
once training has ended (``mlflow_tracker.client.sched``).

Every call is synchronous: it returns once the child has done it (so ``flush`` stays a barrier) and raises what MLflow
raised there as a ``TrackerError``, ``error_code`` included. What a call returns comes back as plain data (MLflow's
entities as ``SimpleNamespace`` with the same attribute names), so the training process never imports MLflow (~1.2
CPU-s and ~120 MB of its RSS on this project's VM). A child that died is started again on the next call. The child
dies with the process that started it, ``kill -9`` included: Linux's ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, set by the
child (the signal comes when the thread that started it ends: the sink's builder, or the sink's own thread for a
restarted child); elsewhere it ends at the end of its input. A reply to a parent that is gone ends it without a word
(no ``BrokenPipeError``), and it ends with ``os._exit``: MLflow's modules are not torn down. Its stderr is a pipe of
its own, copied to this process's stderr by a thread (``_relay``): a child that outlives the close (a call still in
flight when the close bound passed), or is slow to die (idle-class beside busy processes: 15 s and more), never
holds the caller's stderr open, which a reader waiting for its end (``subprocess.run(capture_output=True)``, a CI
log) would wait for.

Example:
    >>> client = ClientProcess()                      # MLflow is imported in the child meanwhile
    >>> client.connect("sqlite:///mlflow.db", {})
    >>> client.log_batch(run_id, metrics=[("train/loss", 2.5, 1700000000000, 1)], tags=[("k", "v")])
    >>> client.close()
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, BinaryIO, Dict, Optional, Tuple

from msbridge.adapters.mlflow_tracker.client.sched import (CpuAndWait, cpu_and_wait, die_with_parent, go_idle, nice_beside_training,
                                             starved)
from msbridge.masking import MaskingFilter, mask_text

#: Metrics per ``log_batch`` of MLflow's client (it takes 1000 entities a call; the rest leave room for tags).
MLFLOW_BATCH = 900
#: What MLflow imports when installed but does not need for tracking (mlflow-skinny goes without them): the
#: child imports MLflow without them (~65 MB and ~0.35 CPU-s less here); a call that needs one imports it then.
SKIPPED = ("pandas", "pyarrow", "scipy")
#: ``mlflow.entities.ViewType`` values, for ``search_runs`` (without importing MLflow here).
ACTIVE_ONLY, ALL_RUNS = 1, 3
_CONNECT = "_connect"
#: Seconds ``close`` gives the child to exit by itself once its input has ended.
EXIT_WAIT = 1.0
#: Calls ``hurry`` does not cut short: run twice, they would make two runs, or two LoggedModels of one checkpoint.
NOT_REDONE = ("create_run", "create_logged_model")
#: Seconds between two looks of ``hurry`` at a child it has not replaced yet (not starved, or in a ``NOT_REDONE`` call).
RECHECK_S = 0.5


#: Run first in the child: ``msbridge`` as a bare package (its ``__path__`` only), so that importing this module does
#: not run ``msbridge/__init__`` (its config loader, sinks and YAML: ~0.2 CPU-s of the child's ~0.25 to its first
#: answer here, which beside busy processes is most of a restarted child's wait).
_LEAN = ("import sys, types; sys.modules['msbridge'] = package = types.ModuleType('msbridge'); "
         f"package.__path__ = {list(sys.modules['msbridge'].__path__)!r}")


class TrackerError(Exception):
    """What MLflow raised in the child, as plain data: ``error_code`` is MLflow's (``RESOURCE_DOES_NOT_EXIST``
    ...) or None.

    Example:
        >>> TrackerError("MlflowException: Run 'x' not found", "RESOURCE_DOES_NOT_EXIST").error_code
        'RESOURCE_DOES_NOT_EXIST'
    """

    def __init__(self, message: str, error_code: Optional[str] = None) -> None:
        super().__init__(message)
        self.error_code = error_code

    def __reduce__(self) -> Any:
        return TrackerError, (str(self), self.error_code)


class ClientProcess:
    """``MlflowClient(uri)`` in a child process: ``client.name(*args, **kwargs)`` runs there.

    ``log_batch`` takes plain tuples, cheaper to send than MLflow's entities:
    metrics ``(key, value, timestamp_ms, step)``, params and tags ``(key, value)``.
    """

    def __init__(self) -> None:
        self.uri = ""
        self._env: Dict[str, str] = {}
        self._beside_training = False  # the child drops to SCHED_IDLE after its first metrics (``mlflow_tracker.client.sched``)
        self._proc: Optional[subprocess.Popen] = None
        self._connected = False  # whether the running child has the URI
        self._slowed = False  # the running child is niced or idle-class for a live training
        self._in_flight = ""  # the call the child is in
        self._timing: Tuple[float, CpuAndWait, Optional[float], CpuAndWait] = (0.0, None, None, None)
        self._replaced: Optional[subprocess.Popen] = None  # the child ``hurry`` killed: its call is redone
        self._lock = threading.Lock()  # ``hurry`` (any thread) against a call starting
        self._recheck: Optional[threading.Timer] = None  # ``hurry``'s next look at a child it left
        self.start()

    def start(self) -> None:
        """Start the child (if none is running); it imports MLflow while the caller goes on."""
        if self._proc is None or self._proc.poll() is not None:
            # not ``-m``: as ``__main__`` the child's TrackerError would not unpickle here
            command = f"{_LEAN}; from {__name__} import main; main({os.getpid()})"
            self._proc = subprocess.Popen([sys.executable, "-c", command],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            threading.Thread(target=_relay, args=(self._proc.stderr,), name="msbridge-mlflow-stderr",
                             daemon=True).start()
            self._connected, self._slowed = False, self._beside_training
            if self._beside_training:
                nice_beside_training(self._proc)

    def connect(self, uri: str, env: Dict[str, str], beside_training: bool = False) -> None:
        """The tracking URI and environment (MLflow's HTTP limits) the child's ``MlflowClient`` uses, and
        whether it serves a live training (then it runs at ``mlflow_tracker.client.sched.NICE`` above this process from now, and
        drops to ``SCHED_IDLE`` once its first metrics are stored); sent with the next call, and again to a restarted
        child."""
        self.uri, self._env, self._connected = uri, dict(env), False
        self._beside_training = self._slowed = beside_training
        if beside_training:
            nice_beside_training(self._proc)

    def hurry(self) -> bool:
        """Training has ended: from now the child runs at this process's priority. A child slowed for training
        (niced or idle-class, which no unprivileged process can undo) and ``_starved`` is killed, its call redone on
        a new one. One in a ``NOT_REDONE`` call, or not starved yet, is looked at again every ``RECHECK_S`` s until
        it is replaced or closed: a call that starts or starves later is caught while it runs, not after it. Safe
        from any thread; True if a child was killed."""
        with self._lock:
            proc, self._beside_training = self._proc, False
            if proc is None or not self._slowed:
                return False
            if self._in_flight in NOT_REDONE or not self._starved():
                if self._recheck is None:
                    self._recheck = threading.Timer(RECHECK_S, self._look_again)
                    self._recheck.daemon = True
                    self._recheck.start()
                return False
            self._replaced, self._slowed = proc, False
            proc.kill()
            return True

    def _look_again(self) -> None:
        """``hurry``'s next look, on its timer's thread."""
        self._recheck = None
        self.hurry()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._call(name, args, kwargs)

    def _call(self, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        while True:
            self.start()
            if not self._connected:
                self._connected = True
                self._call(_CONNECT, (self.uri, self._env, self._beside_training), {})
            with self._lock:
                proc, self._in_flight = self._proc, name
                self._timing = (time.monotonic(), cpu_and_wait(proc.pid), None, None)
            try:
                pickle.dump((name, args, kwargs), proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                proc.stdin.flush()
                ok, value = pickle.load(proc.stdout)
                break
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                if self._replaced is proc:  # ``hurry`` killed it: the same call on a new child
                    self._replaced = None
                    proc.wait()
                    continue
                self.close()
                raise ConnectionError(f"MLflow's client process ended ({type(exc).__name__}: {exc})") from None
            finally:
                self._in_flight = ""
        self._timing = self._timing[:2] + (time.monotonic(), cpu_and_wait(proc.pid))
        if self._slowed and not self._beside_training:  # hurried, and this call was starved: replaced now
            self.hurry()
        if ok:
            return value
        raise value

    def _starved(self) -> bool:
        """Whether the call in flight (else the last one) is ``starved``."""
        start, then, end, now = self._timing
        if end is not None:  # no call in flight: the last one's, every wait of it counted
            return starved(then, now, end - start)
        proc = self._proc
        return proc is not None and starved(then, cpu_and_wait(proc.pid), time.monotonic() - start, proc.pid)

    def close(self) -> None:
        """End the child: it sees the end of its input and exits; one that has not within ``EXIT_WAIT`` s (an
        idle-class child beside busy processes may get no CPU to) is killed: every call was answered, so each of
        its writes is committed, and a kill needs no CPU of it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=EXIT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _relay(stream: BinaryIO) -> None:
    """Copy the child's stderr, line by line, to this process's ``sys.stderr`` until the child has ended."""
    with stream:
        for line in iter(stream.readline, b""):
            with contextlib.suppress(AttributeError, OSError, ValueError):  # no stderr (left, or closed at exit)
                sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()


class _Skip:
    """An import finder under which ``SKIPPED`` packages are not installed (while MLflow is imported)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] in SKIPPED:
            raise ModuleNotFoundError(f"{name} is not imported with MLflow's client", name=name)


def import_client() -> Any:
    """``MlflowClient``, imported without ``SKIPPED``; with them if this MLflow cannot do without."""
    skip = _Skip()
    sys.meta_path.insert(0, skip)
    try:
        from mlflow.tracking import MlflowClient

        return MlflowClient
    except ImportError:
        for name in [m for m in sys.modules if m.partition(".")[0] == "mlflow"]:
            del sys.modules[name]
    finally:
        sys.meta_path.remove(skip)
    from mlflow.tracking import MlflowClient

    return MlflowClient


class _Tracker:
    """The child's side: for a ``sqlite:///`` store, the calls ``mlflow_tracker.store.native`` does itself (a run, its params,
    tags, metric rows, status and text artifacts, with no MLflow import); anything else, and any other store,
    through ``MlflowClient(uri)``, with metric rows written by ``mlflow_tracker.store.rows`` where they apply (MLflow's ORM
    costs ~16x their CPU). A sqlite store is made (a copy of MLflow's template, ``mlflow_tracker.store.template``) or a
    half-made one repaired once and whole, under a lock beside it (``mlflow_tracker.store.local``)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._client: Any = None
        self._rows: Any = False  # False: not looked at yet; None: MLflow's client writes them
        self._native: Any = False  # False: not looked at yet; None: not a sqlite store this path serves

    def call(self, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        native = self._native_store()
        if native is not None:
            from msbridge.adapters.mlflow_tracker.store.native import NotNative

            try:
                return native.call(name, args, kwargs)
            except NotNative:
                pass  # MLflow's client does it
        if self._client is None:
            from msbridge.adapters.mlflow_tracker.store.local import open_client

            self._client = open_client(self.uri, import_client())
        if name != "log_batch":
            return getattr(self._client, name)(*args, **kwargs)
        from mlflow.entities import Metric, Param, RunTag

        run_id = args[0]
        metrics, params, tags = (kwargs.get(part, ()) for part in ("metrics", "params", "tags"))
        if metrics and self._metric_rows() is not None and self._rows.log(run_id, metrics, tags):
            metrics = tags = ()
        parts = [metrics[i:i + MLFLOW_BATCH] for i in range(0, len(metrics), MLFLOW_BATCH)] or [()]
        for i, part in enumerate(parts):  # MLflow's client takes 1000 entities a call; the tags go with the last
            last = i == len(parts) - 1
            if part or (last and (params or tags)):
                self._client.log_batch(run_id, metrics=[Metric(*m) for m in part],
                                       params=[Param(*p) for p in params] if last else [],
                                       tags=[RunTag(*t) for t in tags] if last else [])

    def close(self) -> None:
        for part in (self._rows, self._native):
            if part:
                part.close()

    def _native_store(self) -> Any:
        """The store's ``NativeStore`` (the store made whole first), or None where it does not apply."""
        if self._native is False:
            from msbridge.adapters.mlflow_tracker.store.native import NativeStore
            from msbridge.adapters.mlflow_tracker.store.local import make_whole, store_file, store_lock

            path, self._native = store_file(self.uri), None
            if path is not None:
                with store_lock(path):
                    make_whole(path, lambda uri: import_client()(uri))
                store = NativeStore(path)
                if store.matches_schema():
                    self._native = store
                else:
                    store.close()
        return self._native

    def _metric_rows(self) -> Any:
        if self._rows is False:  # by the first metrics, MLflow's client has made the store's tables
            from msbridge.adapters.mlflow_tracker.store.rows import rows_for

            self._rows = rows_for(self.uri)
        return self._rows


def _plain(value: Any) -> Any:
    """``value`` without MLflow's classes: an entity (``Run``, ``Experiment`` ...) as a ``SimpleNamespace``
    of its properties, a ``PagedList`` as a list; what unpickles without importing MLflow."""
    if type(value).__module__.startswith("mlflow.") and hasattr(value, "_properties"):
        return SimpleNamespace(**{key: _plain(item) for key, item in value})
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _reply(ok: bool, value: Any) -> bytes:
    """The pickled answer: plain data, or the error as a ``TrackerError``."""
    if not ok:
        value = TrackerError(f"{type(value).__name__}: {value}", getattr(value, "error_code", None))
    return pickle.dumps((ok, _plain(value) if ok else value), protocol=pickle.HIGHEST_PROTOCOL)


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """Answer calls until the input ends; ``_connect(uri, env, beside_training)`` (re)points the tracker, and
    beside training the child drops to ``SCHED_IDLE`` once the first metrics are stored (``mlflow_tracker.client.sched``)."""
    tracker = _Tracker("")
    idle_after_start = False
    while True:
        try:
            name, args, kwargs = pickle.load(requests)
        except EOFError:
            tracker.close()
            return
        try:
            if name == _CONNECT:
                uri, env, idle_after_start = args
                os.environ.update(env)
                tracker.close()
                tracker = _Tracker(uri)
                answer = _reply(True, None)
            else:
                answer = _reply(True, tracker.call(name, args, kwargs))
                if idle_after_start and name == "log_batch" and kwargs.get("metrics"):
                    go_idle()
                    idle_after_start = False
        except Exception as exc:  # sent back and raised in the parent
            answer = _reply(False, exc)
        replies.write(answer)
        replies.flush()


class _Masked:
    """A text stream that masks URI credentials in what is written to it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(mask_text(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(parent: int = 0) -> None:
    """The child: dies with ``parent`` (its pid), answers calls on stdin/stdout until the input ends."""
    die_with_parent(parent)
    # Only MindSpore needs protobuf's pure-Python runtime; MLflow (REST) is faster on the default one.
    if os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION") == "python":
        del os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"]
    # MLflow logs every failed SQL call as an ERROR with its traceback (a full disk: one per retry); the error
    # goes back to the parent, which says it once.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    logging.getLogger("msbridge").addFilter(MaskingFilter())  # what ``msbridge/__init__`` does, not run here
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the replies
    sys.stdout = sys.stderr = _Masked(sys.stderr)  # MLflow prints "View run ... at: <uri with password>"
    try:
        serve(sys.stdin.buffer, replies)
    except (BrokenPipeError, ConnectionResetError):  # the parent is gone: nobody to answer, nothing to say
        pass
    try:
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(0)  # every call is answered: skip tearing MLflow's ~1700 modules down
