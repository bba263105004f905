"""A check registers itself: every file of ``health/detectors`` by its decorator, a plug-in by its entry point."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from msbridge.health import detectors
from msbridge.health.detectors import DETECTORS, Detector, Finding, StepView, register_detector
from msbridge.health.detectors.base import LOG
from msbridge.health.spec import HealthSpec


def test_every_file_of_the_folder_registers_its_check():
    folder = Path(detectors.__file__).parent
    files = {p.stem for p in folder.glob("*.py")} - {"__init__", "base"}
    modules = {cls.__module__.rsplit(".", 1)[-1] for cls in DETECTORS.values()}
    assert files <= modules and all(DETECTORS[name].name == name for name in DETECTORS)


def test_checks_look_in_graph_ones_first_then_by_name():
    names = list(DETECTORS)
    skips = [n for n in names if DETECTORS[n].in_graph_skip]
    assert names == skips + sorted(n for n in names if n not in skips) and skips


def test_a_decorated_check_is_configured():
    before = dict(DETECTORS)  # the one table, restored below

    @register_detector("lr_zero")
    class LrZero(Detector):
        default_action = {"debug": LOG, "production": LOG}

        def observe(self, view: StepView):
            return Finding(self.name, view.step) if view.values.get("train/lr") == 0.0 else None

    try:
        assert LrZero.name == "lr_zero" and DETECTORS["lr_zero"] is LrZero
        assert list(DETECTORS) == sorted(DETECTORS, key=lambda n: (not DETECTORS[n].in_graph_skip, n))
        spec = HealthSpec.parse({"lr_zero": {"action": "log"}})
        assert "lr_zero" in spec.checks
    finally:
        DETECTORS.clear()
        DETECTORS.update(before)


def _install(tmp_path: Path, entry: str, module: str) -> dict:
    (tmp_path / "my_check.py").write_text(textwrap.dedent(module))
    info = tmp_path / "my_check-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-check\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[msbridge.health]\n{entry}\n")
    return dict(os.environ, PYTHONPATH=str(tmp_path))


def test_a_check_of_another_package_registers_through_its_entry_point(tmp_path):
    env = _install(tmp_path, "loss_above = my_check:LossAbove", """
        from msbridge.health.detectors.base import LOG, Detector, Finding

        class LossAbove(Detector):  # not decorated: the entry point names it
            default_action = {"debug": LOG, "production": LOG}

            def observe(self, view):
                return Finding(self.name, view.step) if view.loss and view.loss > 5 else None
    """)
    code = ("import json; from msbridge.health.detectors import DETECTORS;"
            "from msbridge.config.load import load_config;"
            "cfg = load_config({'health': {'loss_above': {'action': 'log'}}});"
            "print(json.dumps([list(DETECTORS), sorted(cfg.health_spec.checks)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    names, configured = json.loads(out.stdout)
    assert "loss_above" in names and "loss_above" in configured


def test_a_broken_plug_in_is_said_and_left_out(tmp_path):
    env = _install(tmp_path, "broken = my_check:Missing", "X = 1\n")
    code = "import msbridge; from msbridge.health.detectors import DETECTORS; print('broken' in DETECTORS)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-3000:]
    assert "msbridge: health check 'broken' (entry point my_check:Missing) did not load" in out.stderr



def test_a_plug_in_check_named_like_a_built_in_is_an_error_naming_both_packages(tmp_path):
    """The sinks' rule (tests/test_plugins.py): the plug-in is not loaded, and naming the name in YAML is an error
    naming both packages, never the built-in used silently."""
    env = _install(tmp_path, "nonfinite = my_check:NotFinite", """
        from msbridge.health.detectors.base import LOG, Detector

        class NotFinite(Detector):
            default_action = {"debug": LOG, "production": LOG}

            def observe(self, view):
                return None
    """)
    code = textwrap.dedent("""
        import json
        from msbridge.config.load import load_config
        from msbridge.errors import MsbridgeError
        from msbridge.health.detectors import DETECTORS
        try:
            load_config({'health': {'nonfinite': {'action': 'log'}}})
            said = None
        except MsbridgeError as exc:
            said = str(exc)
        print(json.dumps([said, DETECTORS['nonfinite'].__module__]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said, module = json.loads(out.stdout)
    words = ("two health checks are named 'nonfinite': the built-in msbridge.health.detectors.nonfinite (package "
             "msbridge) and the entry point my_check:NotFinite (package my-check); rename the plug-in's")
    assert said is not None and words in said, said
    assert module == "msbridge.health.detectors.nonfinite"
    assert out.stderr.count(f"msbridge: {words}") == 1, out.stderr[-3000:]
