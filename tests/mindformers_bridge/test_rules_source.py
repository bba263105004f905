"""mindformers' rules on a run YAML are read from its source, never by importing it (``mindformers_rules``).

So ``config check`` on a mindformers run YAML works the same where mindformers is not installed (the
MindSpore 2.10 compatibility venv: 1.9.0's keys are used there) and with any installed release (1.6's
``MonitorConfig`` has 16 keys, 1.9's 19). The wrapper-reset prediction needs no mindformers either: it is
checked here on the 15 trimmed real run YAMLs, and against mindformers' own reset code in test_pipeline.py.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from helpers.mf_runs import RUN_YAMLS

from msbridge.config import mindformers_rules as rules
from msbridge.config.prepare import prepare

pytestmark = pytest.mark.compat  # also run against the oldest supported pair and without mindformers (.ci/compat.sh)

INSTALLED = importlib.util.find_spec("mindformers") is not None
#: config check on a run YAML in a fresh process: what of mindformers it imported, said and read.
CHECK = """
import json, sys
from msbridge.config import mindformers_rules as rules
from msbridge.config.prepare import prepare
prepared = prepare(sys.argv[1])
print(json.dumps({"imported": sorted(m for m in sys.modules if m.split(".")[0] == "mindformers"),
                  "notes": [n.text for n in prepared.notes], "problems": list(prepared.problems),
                  "keys": list(rules.monitor_keys())}))
"""


def test_the_real_yamls_cover_both_resets_and_none():
    prepared = [prepare(p) for p in RUN_YAMLS]
    assert [p.problems for p in prepared] == [[]] * len(RUN_YAMLS)
    predicted = [rules.wrapper_reset(p.tree.data) for p in prepared]
    whys = [p["why"].split(":")[0] for p in predicted if p]
    assert len(RUN_YAMLS) == 15
    assert whys.count("pipeline_stage") == 10 and whys.count("gradient_accumulation_steps") == 3
    assert predicted.count(None) == 2


def _installed_keys():
    from mindformers.tools.register.template import MonitorConfig

    return {k for k, v in vars(MonitorConfig).items() if not k.startswith("_") and not callable(v)}


def test_config_check_of_a_pipeline_run_yaml_imports_nothing_of_mindformers(tmp_path):
    path = next(p for p in RUN_YAMLS if (rules.wrapper_reset(prepare(p).tree.data) or {}).get("stages", 1) > 1)
    out = subprocess.run([sys.executable, "-c", CHECK, path], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["imported"] == [] and found["problems"] == []
    said = [n for n in found["notes"] if n.startswith("runner_wrapper -> mindformers replaces it")]
    assert len(said) == 1 and "msbridge keeps its ring around that cell" in said[0]
    if INSTALLED:  # the installed release's own keys (vars(MonitorConfig) in this process, not the child)
        assert set(found["keys"]) == _installed_keys()
    else:
        assert found["keys"] == list(rules.MONITOR_KEYS_1_9)
