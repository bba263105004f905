"""A real MindInsight 2.3.1 for the tests, run from ``.venv-mindinsight`` on 127.0.0.1.

``bash .ci/mindinsight_venv.sh`` builds that venv. Without it the tests skip, naming
that command; in CI (``CI`` set, as ``.ci/run`` does) they fail instead, since CI
builds it first. ``MSBRIDGE_SKIP_MINDINSIGHT=1`` skips them even where it is built.

``mindinsight start`` launches gunicorn (master, worker, a listener process)
and returns. It is started in a new session, so every process it leaves has
the start command's pid as its process group: stopping kills that group and
checks that nothing of it is left.

Example:
    >>> with serve(summary_base_dir, workspace) as mi:
    ...     mi.wait_for_points("./r1_rank_0", "1_train/loss/scalar", 12)
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from helpers.processes import free_port, group_alive, stop_group

VENV = Path(__file__).resolve().parents[2] / ".venv-mindinsight"
API = "/v1/mindinsight"


def require_mindinsight() -> Path:
    """The venv's ``mindinsight`` script; when it is missing, skip saying how to build it (fail in CI)."""
    if os.environ.get("MSBRIDGE_SKIP_MINDINSIGHT") == "1":
        pytest.skip("MSBRIDGE_SKIP_MINDINSIGHT=1")
    script = VENV / "bin" / "mindinsight"
    if not script.exists():
        why = f"MindInsight's venv {VENV} is not built: `bash .ci/mindinsight_venv.sh` builds it (about 470 MB)"
        if os.environ.get("CI"):  # as helpers.postgres: CI builds it first
            pytest.fail(f"{why}; CI builds it before the tests", pytrace=False)
        pytest.skip(why)
    return script


class MindInsight:
    """A small client of MindInsight's REST API."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}{API}"

    def get(self, path: str, **query: Any) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(query)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # MindInsight answers "not loaded yet" with an error body
            return json.loads(exc.read() or b"{}")

    def post(self, path: str, body: Dict[str, Any]) -> Any:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def train_jobs(self) -> Dict[str, Any]:
        return {job["train_id"]: job for job in self.get("/datavisual/train-jobs")["train_jobs"]}

    def scalars(self, train_id: str, tag: str) -> List[Dict[str, Any]]:
        return self.get("/datavisual/scalar/metadata", train_id=train_id, tag=tag).get("metadatas", [])

    def wait_for_points(self, train_id: str, tag: str, count: int, timeout: float = 90.0) -> List[Dict[str, Any]]:
        """Poll until MindInsight has loaded ``count`` points of ``tag`` (it reloads every second here)."""
        deadline = time.monotonic() + timeout
        points: List[Dict[str, Any]] = []
        while time.monotonic() < deadline:
            points = self.scalars(train_id, tag)
            if len(points) >= count:
                return points
            time.sleep(0.5)
        raise AssertionError(f"MindInsight served {len(points)} of {count} points of {tag} in {train_id} "
                             f"within {timeout:.0f} s; train jobs: {sorted(self.train_jobs())}")


@contextmanager
def serve(summary_base_dir: str, workspace: str, timeout: float = 90.0) -> Iterator[MindInsight]:
    """Run ``mindinsight start`` on a free port; stop it and every process it started afterwards."""
    script = require_mindinsight()
    port = free_port()
    # `mindinsight start` runs `gunicorn` from PATH; `stop` logs to MINDINSIGHT_WORKSPACE (default ~/mindinsight).
    env = dict(os.environ, PATH=f"{script.parent}{os.pathsep}{os.environ.get('PATH', '')}",
               MINDINSIGHT_WORKSPACE=workspace)
    start = subprocess.Popen(
        [str(script), "start", "--summary-base-dir", summary_base_dir, "--port", str(port),
         "--workspace", workspace, "--reload-interval", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    pgid = start.pid
    try:
        out, _ = start.communicate(timeout=timeout)
        if start.returncode != 0:
            raise AssertionError(f"mindinsight start failed ({start.returncode}): {out.decode(errors='replace')}")
        client = MindInsight(port)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.train_jobs()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield client
    finally:
        if start.poll() is None:
            start.kill()
            start.wait()
        subprocess.run([str(script), "stop", "--port", str(port)], env=env, capture_output=True, timeout=60)
        stop_group(pgid)
        assert not group_alive(pgid), f"MindInsight processes of group {pgid} survived stop and SIGKILL"

