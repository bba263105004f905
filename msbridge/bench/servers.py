"""Local servers for ``msbridge bench`` and the tests: a throwaway PostgreSQL cluster and an ``mlflow server``.

Both listen on 127.0.0.1 only, on a free port, and are started in a session of their own, so
``stop`` signals exactly their process group and checks nothing of it is left. PostgreSQL comes from
the system (Debian: ``apt-get install postgresql``, see ``.ci/postgres.sh``); its binaries are found on
``PATH`` or in ``/usr/lib/postgresql/<version>/bin``. PostgreSQL refuses to run as root: as root, the
cluster runs as the ``postgres`` user the package creates, in a directory of its own under the temp dir.

Example:
    >>> with PostgresCluster() as pg, MlflowServer("/tmp/srv", backend_uri=pg.uri) as server:
    ...     MlflowClient(server.uri).search_experiments()
    >>> server.kill(); server.start()   # an outage, then the same server on the same port
"""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Dict, Iterable, Iterator, List, Optional

from ..errors import MsbridgeError
from ..process_group import free_port, group_alive, stop_group

#: The user a cluster runs as when this process is root (Debian's package creates it).
PG_USER = "postgres"


def postgres_bindir() -> Optional[str]:
    """Where ``initdb`` and ``pg_ctl`` are: on ``PATH``, else Debian's newest ``/usr/lib/postgresql/N/bin``."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return os.path.dirname(os.path.realpath(found))
    versions = [p.split("/")[4] for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    newest = max((v for v in versions if v.isdigit()), key=int, default=None)
    return f"/usr/lib/postgresql/{newest}/bin" if newest else None


def _tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()[-chars:]
    except OSError:
        return ""


class PostgresCluster:
    """A PostgreSQL cluster in a fresh temp dir (``initdb``, trust auth on 127.0.0.1 only) with one database.

    ``uri`` is the SQLAlchemy URI MLflow takes (driver: psycopg 3, SQLAlchemy 2.1's default, from ``msbridge[test]``).

    Example:
        >>> with PostgresCluster() as pg:
        ...     print(pg.uri)            # postgresql+psycopg://postgres@127.0.0.1:40123/mlflow
    """

    def __init__(self, port: Optional[int] = None, database: str = "mlflow", nice: int = 0) -> None:
        self.bindir = postgres_bindir()
        if self.bindir is None:
            raise MsbridgeError("PostgreSQL is not installed (initdb/pg_ctl not found); "
                                "on Debian: bash .ci/postgres.sh (apt-get install postgresql)")
        self.port = port or free_port()
        self.database = database
        self.nice = nice
        self.root = ""
        self._as_user: List[str] = []
        if os.geteuid() == 0:  # postgres will not run as root
            try:
                self._owner = pwd.getpwnam(PG_USER)
            except KeyError:
                raise MsbridgeError(f"running as root and there is no {PG_USER!r} user to run PostgreSQL as") from None
            self._as_user = ["runuser", "-u", PG_USER, "--"]

    @property
    def uri(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}"

    @property
    def data_dir(self) -> str:
        return os.path.join(self.root, "data")

    @property
    def log_path(self) -> str:
        return os.path.join(self.root, "postgres.log")

    def start(self) -> "PostgresCluster":
        """``initdb``, start on 127.0.0.1:``port`` (no Unix socket), create the database."""
        self.root = tempfile.mkdtemp(prefix="msbridge-pg-")
        if self._as_user:
            os.chown(self.root, self._owner.pw_uid, self._owner.pw_gid)
            os.chmod(self.root, 0o700)
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories=''"
        try:
            self._run(["initdb", "-D", self.data_dir, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                       "--locale=C", "--no-sync"])
            self._run(["pg_ctl", "-D", self.data_dir, "-l", self.log_path, "-o", options, "-w", "-t", "60",
                       "start"], nice=self.nice)
            self.create_database(self.database)
        except subprocess.CalledProcessError as exc:
            detail = f"{exc.stdout or ''}{exc.stderr or ''}\n{_tail(self.log_path)}"
            self.stop()
            raise MsbridgeError(f"PostgreSQL did not start ({' '.join(map(str, exc.cmd[-3:]))}): {detail}") from None
        except BaseException:  # a Ctrl-C or SIGTERM while it starts: nothing of it is left running
            self.stop()
            raise
        return self

    def create_database(self, name: str) -> str:
        """Create database ``name`` in the running cluster; returns its SQLAlchemy URI."""
        subprocess.run([os.path.join(self.bindir, "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                        "-U", "postgres", name], check=True, capture_output=True, text=True)
        return self.uri.rsplit("/", 1)[0] + "/" + name

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory."""
        if not self.root:
            return
        if os.path.exists(os.path.join(self.data_dir, "postmaster.pid")):
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run(["pg_ctl", "-D", self.data_dir, "-m", "fast", "-w", "-t", "30", "stop"])
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = ""

    def _run(self, cmd: List[str], nice: int = 0) -> None:
        niced = ["nice", "-n", str(nice)] if nice else []
        subprocess.run([*niced, *self._as_user, os.path.join(self.bindir, cmd[0]), *cmd[1:]], check=True,
                       capture_output=True, text=True, cwd="/")

    def __enter__(self) -> "PostgresCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with a backend store (a sqlite file in ``root`` by default) and
    artifacts served from ``root/artifacts``. The job runner (huey consumers) is switched off.

    Args:
        root: directory for the sqlite database, the served artifacts and the server log.
        backend_uri: another backend store, e.g. ``PostgresCluster().uri``.
        port: the port; a free one by default. A restart reuses it.
        seed: a sqlite file with MLflow's tables already made, copied in as the database when
            there is none yet: the server then skips the migrations (seconds on a small machine).
        nice: the server's nice value (0: as this process).

    Example:
        >>> with MlflowServer(tmp_dir) as server:
        ...     MlflowClient(server.uri).search_experiments()
    """

    def __init__(self, root: str, backend_uri: Optional[str] = None, port: Optional[int] = None,
                 seed: Optional[str] = None, nice: int = 0) -> None:
        self.root = str(root)
        self.backend_uri = backend_uri or f"sqlite:///{os.path.join(self.root, 'mlflow.db')}"
        self.port = port or free_port()
        self.seed = seed
        self.nice = nice
        self.proc: Optional[subprocess.Popen] = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> str:
        return os.path.join(self.root, "server.log")

    def start(self, timeout: float = 120.0) -> "MlflowServer":
        """Start the server and wait until ``/health`` answers (a new database is migrated first)."""
        os.makedirs(self.root, exist_ok=True)
        db = self.backend_uri[len("sqlite:///"):] if self.backend_uri.startswith("sqlite:///") else None
        if self.seed and db and not os.path.exists(db):
            shutil.copyfile(self.seed, db)
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        nice = ["nice", "-n", str(self.nice)] if self.nice else []
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [*nice, sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", "1", "--backend-store-uri", self.backend_uri,
                 "--artifacts-destination", os.path.join(self.root, "artifacts")],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            self._wait_healthy(timeout)
        except BaseException:  # not healthy in time, or a Ctrl-C or SIGTERM meanwhile: nothing of it is left running
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise MsbridgeError(f"mlflow server on {self.uri} not healthy within {timeout:.0f} s:\n"
                                    f"{_tail(self.log_path)}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the server's whole process group at once: an outage, not a shutdown."""
        self._signal_group([signal.SIGKILL])

    def stop(self) -> None:
        """SIGTERM the group, then SIGKILL what is left; raise if anything of it survives."""
        pgid = self._signal_group([signal.SIGTERM, signal.SIGKILL])
        if pgid is not None and group_alive(pgid):
            raise MsbridgeError(f"mlflow server processes of group {pgid} survived")

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


@contextlib.contextmanager
def tracking_servers(backends: Iterable[str], root: str, nice: int = 0) -> Iterator[Dict[str, str]]:
    """One ``mlflow server`` per backend (``sqlite``: a file under ``root``; ``postgresql``: a fresh
    ``PostgresCluster``), all at nice ``nice``; yields ``{backend: tracking URI}``, stops them after.

    Example:
        >>> with tracking_servers(["sqlite", "postgresql"], "./bench_results/servers") as uris:
        ...     uris["postgresql"]        # http://127.0.0.1:40123
    """
    with contextlib.ExitStack() as stack:
        uris: Dict[str, str] = {}
        for backend in dict.fromkeys(backends):
            if backend not in ("sqlite", "postgresql"):
                raise MsbridgeError(f"unknown tracking server backend {backend!r} (sqlite, postgresql)")
            store = stack.enter_context(PostgresCluster(nice=nice)).uri if backend == "postgresql" else None
            server = stack.enter_context(MlflowServer(os.path.join(root, backend), backend_uri=store, nice=nice))
            uris[backend] = server.uri
        yield uris
