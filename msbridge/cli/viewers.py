"""The servers ``msbridge view`` starts (MLflow, TensorBoard, MindInsight, optuna-dashboard), each on 127.0.0.1 and a
free port.

Each server runs in a session of its own: it and every process it starts form
one process group, which ``stop`` ends as a whole (SIGTERM, then SIGKILL), and
Ctrl-C in the terminal reaches only ``msbridge view``, which then stops them.
Each runs in a scratch directory (its working directory, TMPDIR, logs) that
``msbridge view`` removes at the end, so nothing lands beside the user's files.

Example:
    >>> viewer = tensorboard_viewer("/runs/exp/tensorboard/run-1", scratch="/tmp/view")
    >>> viewer.start()
    >>> while viewer.poll_ready() is None: time.sleep(0.5)
    >>> print(viewer.url); viewer.terminate(); viewer.wait_gone(time.monotonic() + 10)
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from ..process_group import free_port, group_alive

#: The only interface a viewer binds.
HOST = "127.0.0.1"
#: Where the project's MindInsight venv lives: at the root of the msbridge checkout.
CHECKOUT = Path(__file__).resolve().parents[2]
MINDINSIGHT_VENV = CHECKOUT / ".venv-mindinsight"
MINDINSIGHT_BUILD = CHECKOUT / ".ci" / "mindinsight_venv.sh"


def _env(scratch: str, extra: Dict[str, str]) -> Dict[str, str]:
    """The environment of a viewer: TMPDIR in ``scratch``; nothing inherited that could move its bind address."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MINDINSIGHT_", "GUNICORN_"))  # MINDINSIGHT_HOST, GUNICORN_CMD_ARGS="--bind ..."
           and k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}  # msbridge's choice for MindSpore, not theirs
    env.update(TMPDIR=scratch, **extra)
    return env


@dataclass
class Viewer:
    """One server: its command, the port it binds on 127.0.0.1, and the page to open.

    ``detaches``: the command returns once the server runs (``mindinsight start``);
    the server's processes stay in the command's process group.
    """

    name: str
    command: List[str]
    port: int
    ready_path: str
    scratch: str
    env: Dict[str, str] = field(default_factory=dict)
    page: str = "/"
    detaches: bool = False
    proc: Optional[subprocess.Popen] = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return self.base_url + self.page

    @property
    def log_path(self) -> str:
        return os.path.join(self.scratch, f"{self.name}.log")

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command, cwd=self.scratch, env=_env(self.scratch, self.env),
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def poll_ready(self) -> Optional[bool]:
        """True once the server answers, False if it ended instead, None while it is starting."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None and (code != 0 or not self.detaches or not group_alive(self.proc.pid)):
            return False
        try:
            with urllib.request.urlopen(self.base_url + self.ready_path, timeout=2) as resp:
                return resp.status == 200 or None
        except OSError:  # not listening yet, or an error page while it loads
            return None

    def alive(self) -> bool:
        return self.proc is not None and group_alive(self.proc.pid)

    def exit_text(self) -> str:
        """How it ended and the last lines of its log, for a message."""
        code = self.proc.poll() if self.proc else None
        try:
            with open(self.log_path, errors="replace") as fh:
                tail = [line.rstrip() for line in fh.read().splitlines() if line.strip()][-5:]
        except OSError:
            tail = []
        said = "".join(f"\n      {line}" for line in tail)
        ended = f"exit code {code}" if code is not None else "still running"
        return ended + (f"; its log ends:{said}" if tail else "")

    def terminate(self) -> None:
        """SIGTERM the whole process group."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def wait_gone(self, deadline: float) -> bool:
        """Wait for the group to end until ``deadline``, then SIGKILL what is left; True if nothing is left."""
        if self.proc is None:
            return True
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            self.proc.poll()  # reap the command itself so it does not count as alive
            time.sleep(0.1)
        if group_alive(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            end = time.monotonic() + 5
            while group_alive(self.proc.pid) and time.monotonic() < end:
                time.sleep(0.1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return not group_alive(self.proc.pid)


def mlflow_viewer(tracking_uri: str, scratch: str) -> Viewer:
    """``mlflow server`` on the store; one worker, no job runner (the UI needs neither)."""
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--host", HOST, "--port", str(port), "--workers", "1",
               "--backend-store-uri", tracking_uri]
    if tracking_uri.startswith("sqlite:///"):  # artifacts of experiments made in the UI: beside the store
        command += ["--artifacts-destination",
                    os.path.join(os.path.dirname(tracking_uri[len("sqlite:///"):]), "mlartifacts")]
    return Viewer("mlflow", command, port, "/health", scratch, {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})


def tensorboard_viewer(logdir: str, scratch: str) -> Viewer:
    """TensorBoard on ``logdir`` with its Python reader (no extra data-server process)."""
    port = free_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", HOST, "--port", str(port),
               "--load_fast", "false"]
    return Viewer("tensorboard", command, port, "/data/logdir", scratch)


def optuna_viewer(storage: str, scratch: str) -> Optional[Viewer]:
    """``optuna-dashboard`` on a sweep's Optuna storage; None when it is not installed (``OPTUNA_MISSING``)."""
    import importlib.util

    if importlib.util.find_spec("optuna_dashboard") is None:
        return None
    port = free_port()
    run = ("import sys; from importlib.metadata import entry_points; "  # its console script, in this Python
           "(script,) = entry_points(group='console_scripts', name='optuna-dashboard'); sys.exit(script.load()())")
    command = [sys.executable, "-c", run, storage, "--host", HOST, "--port", str(port)]
    return Viewer("optuna", command, port, "/api/meta", scratch)


#: The line for a sweep whose viewer is not installed (not in the ``sweep`` extra: PyPI, not the project's mirror).
OPTUNA_MISSING = "not started: optuna-dashboard is not installed; install it with: pip install 'msbridge[sweep]'"


def mindinsight_viewer(venv: Path, summary_base_dir: str, scratch: str, page: str = "/") -> Viewer:
    """``mindinsight start`` from its own venv (it runs ``gunicorn`` from PATH and returns)."""
    port = free_port()
    workspace = os.path.join(scratch, "mindinsight")
    bin_dir = venv / "bin"
    command = [str(bin_dir / "python"), str(bin_dir / "mindinsight"), "start", "--summary-base-dir", summary_base_dir,
               "--port", str(port), "--workspace", workspace, "--reload-interval", "3", "--enable-debugger", "False"]
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "MINDINSIGHT_WORKSPACE": workspace,
           "MINDINSIGHT_HOST": HOST}
    return Viewer("mindinsight", command, port, "/v1/mindinsight/datavisual/train-jobs", scratch, env, page,
                  detaches=True)


def mindinsight_venv() -> Optional[Path]:
    """The project's MindInsight venv, if it is built."""
    ok = all((MINDINSIGHT_VENV / "bin" / name).exists() for name in ("python", "mindinsight", "gunicorn"))
    return MINDINSIGHT_VENV if ok else None


def mindinsight_missing(build_failed: bool = False) -> str:
    """One line: MindInsight is missing, the one command that builds it, and the flag that builds it now."""
    if build_failed:
        return f"not started: bash {MINDINSIGHT_BUILD} did not build {MINDINSIGHT_VENV} (its output is above)"
    if MINDINSIGHT_BUILD.exists():
        return (f"not started: its venv {MINDINSIGHT_VENV} is missing; build it with: bash {MINDINSIGHT_BUILD} "
                "(about a minute, ~470 MB), or add --build-mindinsight to this command")
    return (f"not started: its venv {MINDINSIGHT_VENV} is missing; build it from a msbridge checkout with: "
            "bash .ci/mindinsight_venv.sh")


def build_mindinsight() -> Optional[Path]:
    """Build the MindInsight venv with the checkout's script (its output goes to the terminal); the venv, or
    None if it could not be built."""
    if not MINDINSIGHT_BUILD.exists():
        return None
    print(f"[msbridge] building MindInsight's venv: bash {MINDINSIGHT_BUILD}", flush=True)
    code = subprocess.call(["bash", str(MINDINSIGHT_BUILD)], stdin=subprocess.DEVNULL)
    return mindinsight_venv() if code == 0 else None
