"""A real ``mlflow server`` for the tests: sqlite backend in a temp dir, 127.0.0.1, a free port.

The server (uvicorn and its worker) is started in a new session, so every
process it starts has the server's pid as its process group: ``kill`` and
``stop`` signal that group only, and ``stop`` checks nothing of it is left.
The job runner (huey consumers) is switched off: the tests need tracking only.

Example:
    >>> with MlflowServer(tmp_path) as server:
    ...     MlflowClient(server.uri).search_experiments()
    >>> server.kill(); server.start()   # an outage, then the same server on the same port
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Optional

from processes import free_port, group_alive, stop_group


class MlflowServer:
    """``mlflow server --backend-store-uri sqlite:///{root}/mlflow.db`` on 127.0.0.1.

    Args:
        root: directory for the database, the served artifacts and the server log.
        port: the port; a free one by default. A restart reuses it.
        seed: a sqlite file with MLflow's tables already made, copied in as the database when
            there is none yet: the server then skips the migrations (seconds on a small machine).
    """

    def __init__(self, root: str, port: Optional[int] = None, seed: Optional[str] = None) -> None:
        self.root = str(root)
        self.port = port or free_port()
        self.seed = seed
        self.proc: Optional[subprocess.Popen] = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> str:
        return os.path.join(self.root, "server.log")

    def start(self, timeout: float = 60.0) -> "MlflowServer":
        """Start the server and wait until ``/health`` answers."""
        os.makedirs(self.root, exist_ok=True)
        db = os.path.join(self.root, "mlflow.db")
        if self.seed and not os.path.exists(db):
            shutil.copyfile(self.seed, db)
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", "1", "--backend-store-uri", f"sqlite:///{db}",
                 "--artifacts-destination", os.path.join(self.root, "artifacts")],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(self.log_path, errors="replace") as fh:
                    tail = fh.read()[-3000:]
                raise AssertionError(f"mlflow server on {self.uri} not healthy within {timeout:.0f} s:\n{tail}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the server's whole process group at once: an outage, not a shutdown."""
        self._signal_group([signal.SIGKILL])

    def stop(self) -> None:
        """SIGTERM the group, then SIGKILL what is left; assert nothing of it survives."""
        pgid = self._signal_group([signal.SIGTERM, signal.SIGKILL])
        assert pgid is None or not group_alive(pgid), f"mlflow server processes of group {pgid} survived"

    def _signal_group(self, signals: list) -> Optional[int]:
        if self.proc is None:
            return None
        pgid = self.proc.pid
        stop_group(pgid, signals, wait_s=3)
        self.proc.wait()
        self.proc = None
        return pgid

    def __enter__(self) -> "MlflowServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
