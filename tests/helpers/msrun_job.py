"""``Job``: one msrun launch (or one per simulated node) of tests/helpers/dist_worker.py, and what it left behind.

Every msrun call has a timeout. ``nodes=2`` starts two msrun launchers on this
machine that act as two nodes of one job (``--node_rank 0/1``, one master
port), each with its own output root, as separate machines would have. msrun
starts a scheduler wherever the master address is local, so on one machine the
second launcher starts one too: node 0's is started first and holds the port,
the other cannot bind it (its launcher then exits 1 once its workers are done;
its workers join node 0's scheduler and are unaffected).

Example:
    >>> job = Job(tmp_path, 4, "--steps", "12", "--flush", "4")
    >>> job.proc.returncode, sorted(job.rank_logs())
    (0, [0, 1, 2, 3])
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from helpers.processes import free_port
from msbridge.sinks.runlog import RankLog, read_run

WORKER = Path(__file__).resolve().parent / "dist_worker.py"
BIN = os.path.dirname(sys.executable)


class Job:
    """One msrun job of tests/helpers/dist_worker.py; ``proc`` is node 0's launcher, ``procs`` every node's.

    ``started`` / ``ended`` are wall-clock times (``time.time()``) around the whole job.
    """

    def __init__(self, root: Path, ranks: int, *args: str, node_timeout_s: int = 0, timeout: float = 150.0,
                 nodes: int = 1) -> None:
        self.root, self.ranks, self.nodes = root, ranks, nodes
        env = {k: v for k, v in os.environ.items() if k not in ("MSBRIDGE_TIMESTAMP", "RANK_ID", "RANK_SIZE")}
        env.update(PATH=BIN + os.pathsep + env.get("PATH", ""), GLOG_v="3")
        if node_timeout_s:  # how soon msrun's scheduler gives up on a lost rank (default ~30 s)
            env["MS_NODE_TIMEOUT"] = str(node_timeout_s)
        port = free_port()
        self.started = time.time()
        launchers = []
        deadline = time.monotonic() + timeout
        for node in range(nodes):
            cmd = [os.path.join(BIN, "msrun"), f"--worker_num={ranks}", f"--local_worker_num={ranks // nodes}",
                   f"--master_port={port}", f"--log_dir={self.log_dir(node)}", "--join=True"]
            if nodes > 1:
                cmd += ["--master_addr=127.0.0.1", f"--node_rank={node}"]
            cmd += [str(WORKER), "--out", str(self.out(node)), *args]
            launchers.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
            if nodes > 1 and node == 0:  # node 0's scheduler holds the port before another launcher tries
                _wait_listening(port, deadline)
        self.procs: List[subprocess.CompletedProcess] = []
        for launcher in launchers:
            try:
                out, _ = launcher.communicate(timeout=max(deadline - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                for other in launchers:
                    other.kill()
                raise
            self.procs.append(subprocess.CompletedProcess(launcher.args, launcher.returncode, out, ""))
        self.ended = time.time()
        self.proc = self.procs[0]

    def workers_ok(self, node: int) -> bool:
        """Every worker of ``node`` ended without a traceback in its log."""
        paths = glob.glob(str(self.log_dir(node) / "worker_*.log"))
        return len(paths) == self.ranks // self.nodes and not any(
            "Traceback" in Path(p).read_text(errors="replace") for p in paths)

    def out(self, node: int = 0) -> Path:
        """The output root of a node (the worker's ``--out``)."""
        return self.root / "runs" if self.nodes == 1 else self.root / f"node{node}" / "runs"

    def log_dir(self, node: int = 0) -> Path:
        return self.root / "logs" if self.nodes == 1 else self.root / f"node{node}" / "logs"

    def logs(self) -> str:
        """The workers' own output (for assertion messages)."""
        paths = sorted(p for node in range(self.nodes) for p in glob.glob(str(self.log_dir(node) / "worker_*.log")))
        return "\n".join(Path(p).read_text(errors="replace")[-3000:] for p in paths) or self.proc.stdout[-3000:]

    def run_dir(self, node: int = 0) -> str:
        dirs = glob.glob(str(self.out(node) / "dist" / "dist-*"))
        assert len(dirs) == 1, f"every rank must write to one run dir, found {dirs}\n{self.logs()}"
        return dirs[0]

    def rank_logs(self, node: int = 0) -> Dict[int, RankLog]:
        return read_run(self.run_dir(node)).ranks

    def mlflow_runs(self, node: int = 0) -> list:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{self.out(node) / 'dist' / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("dist")
        return client.search_runs([experiment.experiment_id]) if experiment else []


def _wait_listening(port: int, deadline: float) -> None:
    """Until something listens on TCP ``port`` (read from /proc/net/tcp: no connection is made)."""
    needle = f":{port:04X} "
    while time.monotonic() < deadline:
        with open("/proc/net/tcp", encoding="ascii") as fh:
            if any(needle in line and line.split()[3] == "0A" for line in fh.readlines()[1:]):
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port}: node 0's scheduler did not start")
