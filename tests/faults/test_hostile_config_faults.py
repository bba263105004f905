"""Hostile configs refused before training, each with one line naming the file and key, never a traceback,
never a refused file's content: base-file chains 400 deep or looping, base files that are a token file,
``/etc/passwd`` or a credentials file, a secret's value its YAML tag cannot hold. ``msbridge config check``
is run as a user runs it, and ``BridgeMonitor`` is built from the same files."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from msbridge import BridgeMonitor
from msbridge.config.compose import MAX_BASE_DEPTH
from msbridge.errors import ConfigError

MARK = "s3cr3t"  # every planted secret contains it


def check(tmp_path, name: str) -> subprocess.CompletedProcess:
    """``msbridge config check NAME`` in ``tmp_path``, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "msbridge.cli.main", "config", "check", name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, GLOG_v="3"))


def refused(tmp_path, name: str) -> str:
    """The problems ``config check`` printed for ``name`` (it must exit 1, with no traceback), and the
    same refusal from ``BridgeMonitor`` (one ConfigError, no RecursionError)."""
    done = check(tmp_path, name)
    assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout, done.stderr[-2000:]
    with pytest.raises(ConfigError):
        BridgeMonitor(str(tmp_path / name), progress=False)
    return done.stdout + done.stderr


def test_a_chain_of_400_base_files_is_one_line_naming_the_chain(tmp_path):
    for i in range(400):
        (tmp_path / f"f{i}.yaml").write_text(f"base_config: f{i + 1}.yaml\nflush_steps: {i + 1}\n")
    (tmp_path / "f400.yaml").write_text("flush_steps: 7\n")
    said = refused(tmp_path, "f0.yaml")
    n = MAX_BASE_DEPTH
    assert f"f{n - 1}.yaml:1: base_config: base files nest deeper than {n} levels: f0.yaml -> f1.yaml -> " \
           f"f2.yaml -> f3.yaml -> ... ({n - 7} more) -> f{n - 3}.yaml -> f{n - 2}.yaml -> f{n - 1}.yaml " \
           f"-> f{n}.yaml; refused" in said
    assert said.count("nest deeper") == 1 and "RecursionError" not in said


def test_a_chain_at_the_limit_loads(tmp_path):
    for i in range(MAX_BASE_DEPTH - 1):
        (tmp_path / f"f{i}.yaml").write_text(f"base_config: f{i + 1}.yaml\n")
    (tmp_path / f"f{MAX_BASE_DEPTH - 1}.yaml").write_text("flush_steps: 7\n")
    assert BridgeMonitor(str(tmp_path / "f0.yaml"), progress=False).config.flush_steps == 7


@pytest.mark.parametrize("files,line", [
    ({"l1.yaml": "l2.yaml", "l2.yaml": "l3.yaml", "l3.yaml": "l1.yaml"},
     "l3.yaml:1: base_config: base files include each other: l1.yaml -> l2.yaml -> l3.yaml -> l1.yaml"),
    ({"l1.yaml": "l1.yaml"}, "l1.yaml:1: base_config: base files include each other: l1.yaml -> l1.yaml"),
    ({"l1.yaml": "[l0.yaml, l2.yaml]", "l0.yaml": "null", "l2.yaml": "l0.yaml"}, None),
], ids=["loop-of-three", "self", "diamond-is-no-loop"])
def test_a_loop_of_base_files_is_named_once(tmp_path, files, line):
    for name, base in files.items():
        (tmp_path / name).write_text(f"base_config: {base}\n" if base != "null" else "flush_steps: 3\n")
    if line is None:
        assert BridgeMonitor(str(tmp_path / "l1.yaml"), progress=False).config.flush_steps == 3
        return
    said = refused(tmp_path, "l1.yaml")
    assert line in said and said.count("include each other") == 1


@pytest.mark.parametrize("content,shape", [
    (f"hf_{MARK}_token_0123456789\n", "a str of 26 characters"),
    (f"HF_TOKEN={MARK}-env\nOTHER=x\n", "a str of 27 characters"),
    (f"machine h login bob password {MARK}-netrc\n", "a str of 41 characters"),
    (f"- {MARK}-list-1\n- {MARK}-list-2\n", "a list of 2 items"),
], ids=["token-file", "dotenv", "netrc", "list"])
def test_a_refused_base_file_is_never_printed(tmp_path, content, shape):
    (tmp_path / "secret.txt").write_text(content)
    (tmp_path / "run.yaml").write_text("base_config: secret.txt\nflush_steps: 5\n")
    said = refused(tmp_path, "run.yaml")
    assert f"secret.txt:1: the top level must be a mapping of keys, got {shape} (not shown: is this the right " \
           "file?)" in said
    assert MARK not in said


def test_etc_passwd_as_a_base_file_is_refused_unprinted(tmp_path):
    (tmp_path / "run.yaml").write_text("base_config: /etc/passwd\n")
    said = refused(tmp_path, "run.yaml")
    assert "/etc/passwd:1: the top level must be a mapping of keys, got a str of " in said
    assert "root:" not in said and "/bin/" not in said


def test_a_credentials_file_as_a_base_file_prints_no_secret(tmp_path):
    (tmp_path / "creds").write_text(f"[default]\naws_access_key_id = AKIA{MARK}\naws_secret_access_key = {MARK}\n")
    (tmp_path / "run.yaml").write_text("base_config: creds\n")
    said = refused(tmp_path, "run.yaml")
    assert "creds:1: the top level must be a mapping of keys, got a list of 1 item" in said and MARK not in said


def test_a_secret_its_tag_cannot_hold_is_refused_unprinted(tmp_path):
    (tmp_path / "run.yaml").write_text(f"flush_steps: !!int many\nparams:\n  api_key: !!int {MARK}-int\n")
    said = refused(tmp_path, "run.yaml")
    assert "run.yaml:3: params.api_key: the value (not shown) is not a valid !!int" in said and MARK not in said
    assert "run.yaml:1: flush_steps: 'many' is not a valid !!int" in said, "a value that is no secret is shown"


def test_a_secret_given_with_set_is_never_printed_in_its_error(tmp_path):
    (tmp_path / "run.yaml").write_text(f"flush_steps: 5\nparams:\n  hub_token: {MARK}-file\n")
    done = subprocess.run([sys.executable, "-m", "msbridge.cli.main", "config", "check", "run.yaml", "--set",
                           f"params.api_key=[{MARK}-set", "--set", "params.hub_token.x=1", "--set", "params.lr=[0.1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=dict(os.environ, GLOG_v="3"))
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said and MARK not in said
    assert "--set params.api_key: the value (not shown) is not valid YAML" in said
    assert "--set params.hub_token.x: params.hub_token is a value (not shown), not a mapping" in said
    assert "--set params.lr: the value '[0.1' is not valid YAML" in said, "a value that is no secret is shown"


@pytest.mark.parametrize("alerts", [
    f"alerts:\n  - url: https://bot.example/hook/{MARK}-list\n    format: lark\n",
    f"alerts:\n  targets:\n  - https://hooks.slack.com/services/{MARK}-slack\n",
    f"alerts:\n  targets: {{url: https://bot.example/{MARK}-map}}\n",
], ids=["alerts-as-a-list", "target-as-a-string", "targets-as-a-mapping"])
def test_an_alert_target_in_the_wrong_shape_is_refused_without_its_url(tmp_path, alerts):
    (tmp_path / "run.yaml").write_text(alerts)
    said = refused(tmp_path, "run.yaml")
    assert "run.yaml:" in said and "alerts" in said and "***" in said and MARK not in said
