"""README.md, run as printed: "Use it"'s script with its ``monitor.yaml`` trains a small MindSpore model and exits
with the run's outcome, 3 when a tracker is down (MLflow at a closed port), as the README's words say; its
EventAccumulator lines read that run's TensorBoard files back where the README says each series is."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Tuple

import pytest
import yaml
from helpers.processes import free_port

from msbridge.run.outcome import EXIT_FAILED, EXIT_KILLED, EXIT_OK, EXIT_UNDELIVERED

README = Path(__file__).resolve().parents[2] / "README.md"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: What the README's script leaves to the reader: ``model``, ``epochs`` and ``dataset`` (8 steps on CPU).
PRELUDE = textwrap.dedent("""\
    import mindspore as ms
    import mindspore.dataset as ds
    import numpy as np
    from mindspore import nn
    from mindspore.train import Model

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    dataset = ds.NumpySlicesDataset({"x": x, "y": x.sum(1, keepdims=True)}, shuffle=False).batch(8)
    net = nn.Dense(4, 1)
    model = Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9))
    epochs = 1
""")


def blocks() -> List[Tuple[str, str]]:
    """``(language, code)`` of every fenced block of the README, in order."""
    return _BLOCK.findall(README.read_text(encoding="utf-8"))


def use_it() -> Tuple[str, str]:
    """"Use it"'s Python script and the ``monitor.yaml`` printed under it."""
    script = next(code for lang, code in blocks() if lang == "python" and "BridgeMonitor.from_yaml" in code)
    config = next(code for lang, code in blocks() if lang == "yaml" and code.startswith("experiment: tiny-lm"))
    return script, config


def tensorboard_reader() -> str:
    """The README's lines that read a run's TensorBoard files back."""
    return next(code for lang, code in blocks() if lang == "python" and "EventAccumulator" in code)


def test_use_it_ends_with_the_exit_code_and_the_words_say_so():
    script, _ = use_it()
    assert script.rstrip().splitlines()[-1].startswith("sys.exit(monitor.outcome.exit_code)")
    assert "import sys" in script
    codes = (EXIT_OK, EXIT_UNDELIVERED, EXIT_FAILED, EXIT_KILLED)
    assert f"# {codes[0]}; {codes[1]} when a tracker missed records; {codes[2]} FAILED; {codes[3]} KILLED" in script
    prose = re.sub(r"\s+", " ", README.read_text(encoding="utf-8"))
    assert f"the script above then exits {EXIT_UNDELIVERED}" in prose


@pytest.mark.slow
def test_the_readme_script_exits_3_when_a_tracker_is_down(tmp_path):
    """MLflow's tracking server is a closed port; everything else is the README's own text."""
    script, config = use_it()
    cfg = yaml.safe_load(config)
    assert "mlflow" in cfg["sinks"]
    cfg["sinks"]["mlflow"] = {"tracking_uri": f"http://127.0.0.1:{free_port()}", "http_timeout": 1,
                              "close_timeout": 1}
    (tmp_path / "monitor.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    (tmp_path / "train.py").write_text(PRELUDE + "\n" + script, encoding="utf-8")
    env = {**os.environ, "GLOG_v": "3"}
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == EXIT_UNDELIVERED, done.stderr[-3000:]
    (run_json,) = (tmp_path / "msbridge_runs" / "tiny-lm").glob("*/run.json")
    outcome = json.loads(run_json.read_text(encoding="utf-8"))["outcome"]
    assert outcome["status"] == "FINISHED" and list(outcome["not delivered"]) == ["mlflow"]
    assert "msbridge replay" in outcome["not delivered"]["mlflow"] and "Traceback" not in done.stderr
    read_back = tensorboard_reader().replace("RUN_NAME", run_json.parent.name)
    where: dict = {}
    exec(compile(read_back, "README.md", "exec"), where)  # the README's EventAccumulator lines, as printed
    steps = list(range(1, 9))  # 64 samples in batches of 8
    assert [e.step for e in where["rank_0"].Scalars("train/loss")] == steps
    assert [e.step for e in where["job"].Scalars("train/global_loss")] == steps
    assert "train/loss" not in where["job"].Tags()["scalars"]


def test_without_mindinsight_s_venv_its_tests_skip_naming_the_build_command(monkeypatch, tmp_path):
    """The fast tier passes on a fresh clone: MindInsight's tests skip there; CI, which builds the venv, fails."""
    from helpers import mindinsight_server

    monkeypatch.setattr(mindinsight_server, "VENV", tmp_path / "no-venv")
    monkeypatch.delenv("MSBRIDGE_SKIP_MINDINSIGHT", raising=False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"`bash \.ci/mindinsight_venv\.sh` builds it"):
        mindinsight_server.require_mindinsight()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI builds it before the tests"):
        mindinsight_server.require_mindinsight()
    assert "CI=true" in (README.parent / ".ci" / "run").read_text(encoding="utf-8")


def test_the_front_door_commands_come_first_and_ci_runs_the_suite_s_exactly():
    """The README stays at most 150 lines; its first commands are the demo, the whole suite (which .ci/run runs
    as printed) and the fast tier, which installs pytest before it runs it."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 150
    demo, suite, fast = [code.strip() for lang, code in blocks() if lang == "bash"][:3]
    assert demo.endswith(".venv/bin/msbridge demo") and '-e ".[all]"' in demo
    assert suite in (README.parent / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    install, run = fast.split(" && ")
    assert '-e ".[test]"' in install and run == '.venv/bin/python -m pytest -n 3 --dist loadfile -m "not slow"'
