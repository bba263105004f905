"""MLflow's client process imports less: MLflow without pandas/pyarrow/scipy, and all of it where it must."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

PROBE = """
import sys
from msbridge.adapters.mlflow_tracker.client import process as mp
mp.SKIPPED = mp.SKIPPED + tuple(sys.argv[1:])
client = mp.import_client()("sqlite:///" + {db!r})
exp = client.create_experiment("x")
run = client.create_run(exp).info.run_id
client.set_terminated(run, "FINISHED")
names = ("pandas", "pyarrow", "scipy", "requests")
print(sorted(m for m in names if m in sys.modules), sum(isinstance(f, mp._Skip) for f in sys.meta_path))
"""


@pytest.mark.parametrize("also_skip, imported", [((), "['requests']"),
                                                  # an MLflow that cannot do without a skipped package:
                                                  # it is imported again with everything
                                                  (("requests",), "['pandas', 'pyarrow', 'requests', 'scipy']")])
def test_mlflow_is_imported_without_what_tracking_does_not_need(tmp_path, also_skip, imported):
    out = subprocess.run([sys.executable, "-c", PROBE.format(db=str(tmp_path / "m.db")), *also_skip],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"{imported} 0"  # what was imported; the finder is gone afterwards


def test_close_ends_a_child_that_gets_no_cpu_to_exit_once_every_call_is_answered(tmp_path):
    """A child stopped (SIGSTOP: no CPU at all, as an idle-class child beside busy processes) after its last
    answer: close returns within ``EXIT_WAIT`` + a little, the child is gone, and what it wrote is in the store."""
    import os
    import signal
    import time

    from mlflow.tracking import MlflowClient

    from msbridge.adapters.mlflow_tracker.client.process import EXIT_WAIT, ClientProcess

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = ClientProcess()
    client.connect(uri, {})
    exp = client.create_experiment("x", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(exp, run_name="r").info.run_id
    client.log_batch(run_id, metrics=[("loss", 1.5, 1_700_000_000_000, 1)])
    proc = client._proc
    os.kill(proc.pid, signal.SIGSTOP)
    start = time.monotonic()
    client.close()
    assert time.monotonic() - start < EXIT_WAIT + 2.0
    assert proc.poll() is not None
    assert [m.step for m in MlflowClient(uri).get_metric_history(run_id, "loss")] == [1]



def test_the_child_holds_none_of_the_callers_pipes_and_what_it_prints_reaches_the_callers_stderr(capfd):
    """A child that outlives its caller's close (or is slow to die) never keeps the caller's stdout or stderr open,
    which a reader waiting for their end (``subprocess.run(capture_output=True)``) would wait for (issue 39); what
    it prints is copied to the caller's stderr."""
    import os
    import time

    from msbridge.adapters.mlflow_tracker.client.process import ClientProcess

    client = ClientProcess()
    proc = client._proc
    held = {os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")}
    assert not held & {os.readlink(f"/proc/self/fd/{fd}") for fd in (1, 2)}
    proc.stdin.write(b"not a pickled call\n")  # the child fails, prints its traceback and ends
    proc.stdin.flush()
    proc.wait(timeout=120)
    deadline, err = time.monotonic() + 30, ""
    while "UnpicklingError" not in err and time.monotonic() < deadline:  # the copying thread ends with the child
        err += capfd.readouterr().err
        time.sleep(0.1)
    assert "UnpicklingError" in err
    client.close()
