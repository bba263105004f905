"""Run and experiment names as directories: readable, never escaping the output dir, never two names in one."""
from __future__ import annotations

import os

import pytest

from msbridge.paths import MAX_COMPONENT_BYTES, render_output_dir, safe_component

HOSTILE = [
    "run-ü", "run-é", "run-e\u0301", "run-е",  # ü, é precomposed and decomposed, Cyrillic е
    "run-e", "Run-e", "RUN-E",  # case-only differences
    "../escape", "../../etc/passwd", "..", ".", "", "/abs/path", "a/b", "a\\b", "~/home",
    "nul\x00byte", "new\nline", "tab\tname", "space name", "zero\u200bwidth", "rtl\u202eoverride",
    "x" * 300, "实验" * 100, "実験-1", "ｒｕｎ", "run_", "run", "run.", ".hidden", "-dash", "$HOME", "a:b", "a*b?",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_name_is_one_safe_component(tmp_path, name):
    component = safe_component(name)
    assert component and component not in (".", "..") and not component.startswith(".")
    assert "/" not in component and "\x00" not in component and "\\" not in component
    assert len(component.encode("utf-8")) <= MAX_COMPONENT_BYTES + 9
    assert all(ch.isprintable() and not ch.isspace() for ch in component)
    path = tmp_path / component
    path.mkdir()  # the file system takes it
    assert os.path.dirname(str(path)) == str(tmp_path)


def test_distinct_names_never_share_a_directory(tmp_path):
    components = [safe_component(name) for name in HOSTILE]
    assert len(set(components)) == len(HOSTILE)
    for component in components:
        (tmp_path / component).mkdir()
    assert len(os.listdir(tmp_path)) == len(HOSTILE), "distinct on disk too (this file system keeps case)"


def test_a_plain_name_is_kept_and_a_changed_one_says_so_with_a_stable_hash():
    assert safe_component("tiny-lm-lr0.003-20261130-141309") == "tiny-lm-lr0.003-20261130-141309"
    assert safe_component("run-ü") == "run-ü" and safe_component("实验一") == "实验一"
    changed = safe_component("my run/1")
    assert changed.startswith("my_run_1-") and len(changed) == len("my_run_1-") + 8
    assert safe_component("my run/1") == changed and safe_component("my run_1") != changed


def test_the_output_dir_stays_under_its_template(tmp_path):
    template = str(tmp_path / "{experiment}" / "{run_name}")
    for experiment, run_name in [("../..", "../../etc"), ("/abs", "/abs"), ("exp", "a\x00b"), ("", "")]:
        path = render_output_dir(template, experiment, run_name, 0, "t")
        assert os.path.commonpath([path, str(tmp_path)]) == str(tmp_path) and path.count(os.sep) == \
            str(tmp_path).count(os.sep) + 2
