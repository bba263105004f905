"""`msbridge demo` as a newcomer runs it: --config with --out and --set, then every command it prints, as printed.

Each printed command runs in a fresh shell (no venv on PATH) from the repo root;
`msbridge view` must start, serve the run's loss and stop on Ctrl-C.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers.processes import alive, listening
from helpers.view_process import FRESH_ENV, ROOT, ViewProcess, base, get

from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

MSBRIDGE = str(Path(sys.executable).parent / "msbridge")
STEPS = 20


def printed_commands(stdout: str):
    lines = stdout.splitlines()
    start = lines.index("  look at it:") + 1
    return [line.strip() for line in lines[start:] if line.startswith("    ")]


def readme_commands(run_dir: str):
    text = (Path(run_dir) / "README.md").read_text()
    block = text.split("## Look at it", 1)[1].split("```")[1]
    return [line for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo run with a user's config (jsonl + tensorboard, its own output_dir), --out and a --set."""
    work = tmp_path_factory.mktemp("demo")
    (work / "monitor.yaml").write_text(textwrap.dedent("""\
        experiment: cli-demo
        run_name: r-{timestamp}
        output_dir: ./elsewhere/{run_name}
        sinks: [jsonl, tensorboard]
        params:
          train: {batch_size: 8}
    """))
    command = [MSBRIDGE, "demo", "--steps", str(STEPS), "--config", "monitor.yaml", "--out", str(work / "out"),
               "--set", f"sinks.tensorboard.logdir={work / 'tb'}"]
    proc = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, GLOG_v="3"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("  run dir"))
    return work, run_dir, proc.stdout


def test_demo_composes_config_out_and_set(demo):
    work, run_dir, _ = demo
    assert Path(run_dir).parent == work / "out" / "cli-demo"  # --out moved the config's output_dir
    assert not (work / "elsewhere").exists()
    meta = json.loads((Path(run_dir) / "run.json").read_text())
    assert meta["config"]["sinks"] == {"jsonl": {}, "tensorboard": {"logdir": str(work / "tb")}}  # --set on a list
    params = meta["config"]["params"]
    assert params["train"]["batch_size"] == 8 and params["model"]["vocab_size"] == 64  # the demo fills in the rest
    assert list((work / "tb" / Path(run_dir).name / "rank_0").glob("events.out.tfevents.*"))
    assert sorted(os.listdir(work)) == ["monitor.yaml", "out", "tb"]


def test_printed_commands_run_as_printed_in_a_fresh_shell(demo):
    _, run_dir, stdout = demo
    commands = printed_commands(stdout)
    assert commands == readme_commands(run_dir)
    assert [c.split()[1] for c in commands] == ["view", "plot", "diagnose"]
    assert all(c.startswith(MSBRIDGE + " ") for c in commands)
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    for command in commands:
        if " view " in command:
            check_view_serves_and_stops(command, run_dir)
            continue
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=FRESH_ENV, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert (Path(run_dir) / "plot.png").stat().st_size > 10000
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before, "the commands wrote into the checkout"


def check_view_serves_and_stops(command: str, run_dir: str) -> None:
    want = read_run(run_dir).ranks[0].series("train/loss")
    with ViewProcess(command) as view:
        urls = view.wait_serving()
        assert sorted(urls) == ["tensorboard"], view.lines
        assert "<html" in get(urls["tensorboard"]).lower()
        api = base(urls["tensorboard"]) + "/data/plugin/scalars/scalars?run=rank_0&tag=train/loss"
        deadline = time.monotonic() + 60
        while len(points := get(api)) < len(want) and time.monotonic() < deadline:
            time.sleep(1)
        assert [p[1] for p in points] == [s for s, _ in want]
        assert [p[2] for p in points] == pytest.approx([v for _, v in want], rel=1e-6)
        assert {addr for addr, _, _ in listening(view.processes)} == {"127.0.0.1"}
        assert view.interrupt() == 0, view.lines
        assert view.lines[-1] == "[msbridge] stopped tensorboard"
        assert not alive(view.processes)
