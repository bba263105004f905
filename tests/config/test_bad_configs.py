"""A corpus of broken and hostile configs: each one is a clear problem with its file:line and key.

Every case goes through the API (``load_config``, all cases in one fresh interpreter that
measures each: at most 5 s of CPU time and a peak RSS under 1 GB) and through ``msbridge config check``
in-process, under the same CPU limit: no traceback, no hang, never accepted, and every
problem line names where (``file:line`` or ``--set``) and what (the key, and the nearest
valid key for a misspelt one, or what is wrong with the file). A few also go through the
real console script. Most cases are generated (``bad_config_cases.py``).
"""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from bad_config_cases import generated_cases
from msbridge.cli.main import main

# Per case, in CPU seconds (user + system: what the case itself costs, however busy the machine is);
# the slowest (150k keys, refused at the 50,000th) takes about 2 s. A wall-clock limit failed under load.
LIMIT_S = 5.0
HANG_S = 60.0  # wall seconds, only against a case that waits on nothing
LIMIT_RSS_MB = 1024
CORPUS_RUNNER = Path(__file__).resolve().parents[1] / "helpers" / "config_corpus.py"


def _bomb(levels: int = 9, width: int = 10) -> str:
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\nparams: {{big: *a{levels}}}\n"


def _deep_mapping(levels: int) -> str:
    return "params:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, levels)) + "  " * levels + "k: 1\n"


# name -> (run.yaml content (str or bytes), expected text in the problems, extra files, --set values)
CASES = {
    # -- the file itself
    "empty": ("", "run.yaml:1: the file holds no settings"),
    "only-null": ("null\n", "run.yaml:1: the file holds no settings"),
    "only-comments": ("# nothing here\n# at all\n", "run.yaml:1: the file holds no settings"),
    "only-document-marker": ("---\n", "run.yaml:1: the file holds no settings"),
    "empty-mapping": ("{}\n", "run.yaml:1: the file holds no settings"),
    "not-utf8": (b"flush_steps: 5\nexperiment: caf\xe9\n", "run.yaml:2: not UTF-8 text (byte 30 is 0xe9)"),
    "utf16": ("flush_steps: 5\n".encode("utf-16"), "run.yaml:1: not UTF-8 text (byte 0 is 0xff)"),
    "nul-byte": ("flush_steps: 5\nexperiment: a\x00b\n", "run.yaml:2: YAML does not allow the character '\\x00'"),
    "escape-char": ("experiment: a\x1bb\n", "run.yaml:1: YAML does not allow the character '\\x1b'"),
    "alias-bomb": (_bomb(), "run.yaml:5: more than 100000 keys and items once aliases are expanded"),
    "merge-bomb": ("m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8, i: 9, j: 10}\n"
                   + "".join(f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 10)}]}}\n" for i in range(1, 9)),
                   "more than 100000 keys and items once aliases are expanded"),
    "deep-mapping": (_deep_mapping(150), "run.yaml:100: nested deeper than 100 levels"),
    "deep-flow-list": ("params: " + "[" * 1000 + "]" * 1000 + "\n", "run.yaml:1: nested deeper than 100 levels"),
    "alias-chain-deeper-than-limit": ("".join(f"a{i}: &a{i} [{'*a' + str(i - 1) if i else 1}]\n" for i in range(150)),
                                      "nested deeper than 100 levels once aliases are expanded"),
    "bad-indentation": ("monitor_config:\n  interval: 5\n flush_steps: 3\n", "run.yaml:3: YAML syntax error"),
    "unclosed-quote": ("experiment: 'abc\nflush_steps: 5\n", "YAML syntax error"),
    "unclosed-flow": ("sinks: [jsonl, tensorboard\n", "YAML syntax error"),
    "tab-indent": ("monitor_config:\n\tinterval: 5\n", "run.yaml:2: YAML syntax error"),
    "undefined-alias": ("flush_steps: *nope\n", "run.yaml:1: YAML syntax error: found undefined alias 'nope'"),
    "self-alias": ("params: &p {a: *p}\n", "run.yaml:1: params.a: an alias refers to itself"),
    "top-level-list": ("- flush_steps: 5\n", "run.yaml:1: the top level must be a mapping of keys"),
    "top-level-text": ("just some text\n", "run.yaml:1: the top level must be a mapping of keys"),
    "key-twice": ("flush_steps: 5\nflush_steps: 6\n", "run.yaml:2: flush_steps: key written twice"),
    "list-as-key": ("? [a, b]\n: 1\n", "run.yaml:1: top level: a key must be a scalar"),
    "bad-date": ("params:\n  start: 2024-02-30\n", "run.yaml:2: params.start: '2024-02-30' is not a valid !!timestamp"),
    "bad-int-tag": ("flush_steps: !!int many\n", "run.yaml:1: flush_steps: 'many' is not a valid !!int"),
    "python-tag": ("flush_steps: !!python/name:os.system\n",
                   "run.yaml:1: flush_steps: the YAML tag '!!python/name:os.system' is not allowed"),
    "python-apply-tag": ("flush_steps: !!python/object/apply:os.system [ls]\n",  # nothing runs, nothing is read
                         "run.yaml:1: flush_steps: the YAML tag '!!python/object/apply:os.system' is not allowed"),
    "bad-binary": ("params:\n  blob: !!binary abc\n", "run.yaml:2: params.blob: 'abc' is not a valid !!binary"),
    "merge-a-number": ("params:\n  <<: 5\n", "run.yaml:2: YAML syntax error"),
    "directory": (None, "run.yaml: not a regular file"),
    # -- base files
    "self-include": ("base_config: run.yaml\nflush_steps: 5\n", "run.yaml:1: base_config: base files include each other"),
    "mutual-include": ("base_config: other.yaml\n", "other.yaml:1: base_config: base files include each other",
                       {"other.yaml": "base_config: run.yaml\n"}),
    "missing-base": ("base_config: nowhere.yaml\n", "run.yaml:1: base_config: cannot find 'nowhere.yaml'"),
    "base-not-a-path": ("base_config: 5\n", "run.yaml:1: base_config: expected a file path"),
    "base-in-second-doc": ("flush_steps: 5\n---\nbase: other.yaml\n", "run.yaml:3: base: only the first document",
                           {"other.yaml": "experiment: x\n"}),
    "base-and-base_config": ("base_config: other.yaml\nbase: other.yaml\n", "run.yaml:2: base: use one of",
                             {"other.yaml": "experiment: x\n"}),
    "bad-base-file": ("base_config: other.yaml\n", "other.yaml:1: not UTF-8 text", {"other.yaml": b"a: \xff\n"}),
    # -- values
    "flush-steps-zero": ("flush_steps: 0\n", "run.yaml:1: flush_steps: expected an integer >= 1 and <= 10_000_000, "
                         "got 0"),
    "flush-steps-float": ("flush_steps: 1e36\n", "run.yaml:1: flush_steps: expected an integer >= 1 and <= 10_000_000, "
                          "got 1e+36"),
    "flush-steps-huge": ("flush_steps: 1" + "0" * 36 + "\n", "run.yaml:1: flush_steps: expected an integer >= 1 and <= "
                         "10_000_000, got 1000000000000000000000000000000000000"),
    "flush-steps-text": ("flush_steps: '10'\n", "run.yaml:1: flush_steps: expected an integer >= 1 and <= 10_000_000, "
                         "got '10'"),
    "flush-steps-bool": ("flush_steps: true\n", "run.yaml:1: flush_steps: expected an integer >= 1 and <= 10_000_000, "
                         "got True"),
    "flush-seconds-overflow": ("flush_seconds: 1e400\n", "run.yaml:1: flush_seconds: expected a finite number"),
    "flush-seconds-nan": ("flush_seconds: .nan\n", "run.yaml:1: flush_seconds: expected a finite number > 0 and <= "
                          "10_000_000, got nan"),
    "flush-seconds-negative": ("flush_seconds: -1\n", "run.yaml:1: flush_seconds: expected a number > 0 and <= "
                               "10_000_000, got -1"),
    "collective-timeout-inf": ("collective_timeout_s: .inf\n", "run.yaml:1: collective_timeout_s: expected a finite"),
    "overhead-budget-over-1": ("overhead_budget: 1.5\n", "run.yaml:1: overhead_budget: expected a number > 0 and < 1, "
                               "got 1.5"),
    "overhead-budget-nan": ("overhead_budget: .nan\n", "run.yaml:1: overhead_budget: expected a finite number > 0 and "
                            "< 1, got nan"),
    "step-interval-float": ("step_interval: 2.5\n", "run.yaml:1: step_interval: expected an integer >= 1"),
    "print-interval-negative": ("print_interval: -1\n", "run.yaml:1: print_interval: expected an integer >= 1"),
    "buffer-size-huge": ("buffer_size: 1000000000000\n", "run.yaml:1: buffer_size: expected an integer >= 0 and <= "
                         "100_000_000, got 1000000000000"),
    "seq-length-zero": ("seq_length: 0\n", "run.yaml:1: seq_length: expected null or an integer >= 1"),
    "reduce-ranks-empty": ("reduce_ranks: []\n", "run.yaml:1: reduce_ranks: expected null or a non-empty list"),
    "reduce-ranks-negative": ("reduce_ranks: [0, -1]\n", "run.yaml:1: reduce_ranks: expected null or a non-empty"),
    "monitor-on-text": ("monitor_on: 'yes please'\n", "run.yaml:1: monitor_on: expected true or false"),
    "experiment-empty": ("experiment: ''\n", "run.yaml:1: experiment: expected a non-empty string"),
    "experiment-list": ("experiment: [123]\n", "run.yaml:1: experiment: expected a non-empty string, got [123]"),
    "run-name-unknown-field": ("run_name: 'lr{optimizer.lr}'\n", "run.yaml:1: run_name:"),
    "output-dir-unknown-field": ("output_dir: '/x/{nope}'\n", "run.yaml:1: output_dir:"),
    "unknown-sink": ("sinks: [tensorbord]\n", "run.yaml:1: sinks[0]: unknown sink 'tensorbord'; did you mean"),
    "sinks-number": ("sinks: 5\n", "run.yaml:1: sinks: expected a list of sink names"),
    "sink-options-list": ("sinks:\n  tensorboard: [1, 2]\n", "run.yaml:2: sinks.tensorboard: sink options must be"),
    "tag-value-list": ("tags:\n  team: [a, b]\n", "run.yaml:2: tags: tag values must be strings or numbers"),
    "params-list": ("params: [1, 2]\n", "run.yaml:1: params: expected a mapping"),
    "bad-regex": ("layer_norms: '(['\n", "run.yaml:1: layer_norms: '(['"),
    "unknown-key": ("flush_step: 5\n", "run.yaml:1: flush_step: unknown key; did you mean 'flush_steps'?"),
    "unknown-dialect-key": ("monitor_config:\n  intreval: 5\n", "run.yaml:2: monitor_config.intreval: unknown key"),
    "missing-reference": ("flush_steps: ${train.steps}\n", "run.yaml:1: flush_steps:"),
    "reference-cycle": ("params:\n  a: ${params.b}\n  b: ${params.a}\n", "run.yaml:2: params.a:"),
    "health-not-mapping": ("health: 5\n", "run.yaml:1: health"),
    # -- --set
    "set-not-yaml": ("flush_steps: 5\n", "--set flush_steps: the value '[' is not valid YAML", {}, ["flush_steps=["]),
    "set-alias-bomb": ("flush_steps: 5\n", "--set params.x: the value", {},
                       ["params.x=[" + ", ".join(f"&a{i} [{', '.join([f'*a{i - 1}'] * 10) if i else 'x'}]"
                                                 for i in range(7)) + "]"]),
    "set-no-equals": ("flush_steps: 5\n", "--set 'flush_steps': expected KEY=VALUE", {}, ["flush_steps"]),
    "set-bad-value": ("flush_steps: 5\n", "--set: flush_steps: expected an integer >= 1 and <= 10_000_000, got 'x'",
                      {}, ["flush_steps=x"]),
}
CASES.update(generated_cases())
CLI_CASES = ["alias-bomb", "not-utf8", "self-include", "empty", "nul-byte", "hex-int-6000-digits", "list-bomb",
             "150k-keys-in-params", "python-apply-list", "backoff-initial-above-max", "run-name-secret-template",
             "regex-1000-nested-groups"]
WHERE = re.compile(r"^  (run\.yaml|other\.yaml)(:\d+)?: |^  --set")
API_WHERE = re.compile(r"^(run\.yaml|other\.yaml)(:\d+)?: |^--set")


def _write_case(tmp_path, name):
    text, expected, *more = CASES[name]
    files = dict(more[0]) if more else {}
    if text is None:
        (tmp_path / "run.yaml").mkdir()
    files.setdefault("run.yaml", text)
    for file_name, content in files.items():
        if content is not None:
            data = content.encode("utf-8") if isinstance(content, str) else content
            (tmp_path / file_name).write_bytes(data)
    sets = more[1] if len(more) > 1 else []
    return expected, [arg for value in sets for arg in ("--set", value)]


@contextmanager
def cpu_limit(seconds):
    """Raise TimeoutError in the block after ``seconds`` of this process's CPU time, or ``HANG_S`` wall seconds."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} CPU s" if signum == signal.SIGPROF else
                           f"still running after {HANG_S} s")

    previous = {sig: signal.signal(sig, expire) for sig in (signal.SIGPROF, signal.SIGALRM)}
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_the_corpus_is_big_enough():
    assert len(CASES) >= 150


@pytest.fixture(scope="module")
def api_results(tmp_path_factory):
    """Every case through ``load_config`` in one fresh interpreter: name -> what ``config_corpus.py`` measured."""
    root = tmp_path_factory.mktemp("corpus")
    for name in CASES:
        case = root / name
        case.mkdir()
        _, sets = _write_case(case, name)
        (case / "sets.json").write_text(json.dumps(sets[1::2]))
    done = subprocess.run([sys.executable, str(CORPUS_RUNNER), str(root)], capture_output=True, text=True,
                          timeout=60 + 10 * len(CASES), env=dict(os.environ, GLOG_v="3"))
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert sorted(results) == sorted(CASES)
    return results


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_config_through_the_api_within_time_and_memory(api_results, name):
    expected = CASES[name][1]
    result = api_results[name]
    assert result["outcome"] == "problems", result  # not accepted, no traceback, no timeout
    assert result["seconds"] < LIMIT_S and result["peak_rss_mb"] < LIMIT_RSS_MB, result
    problems = result["problems"]
    assert all(API_WHERE.match(line) for line in problems), problems
    assert any(expected in line for line in problems), problems


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_config_is_one_clear_problem_with_where_and_what(tmp_path, capsys, name):
    expected, sets = _write_case(tmp_path, name)
    start = time.process_time()
    with cpu_limit(LIMIT_S):
        code = main(["config", "check", "run.yaml", *sets])
    cpu_s = time.process_time() - start
    out = capsys.readouterr().out
    assert code == 1, out
    lines = out.splitlines()
    assert re.match(r"run\.yaml: \d+ problems?:$", lines[0]), out
    problems = lines[1:]
    assert problems and all(WHERE.match(line) for line in problems), out
    assert any(expected in line for line in problems), out
    assert "Traceback" not in out and cpu_s < LIMIT_S


@pytest.mark.parametrize("name", CLI_CASES)
def test_bad_config_through_the_console_script(tmp_path, name):
    expected, sets = _write_case(tmp_path, name)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "msbridge.cli.main", "config", "check", "run.yaml", *sets],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120,  # timeout: a hang
                         env=dict(os.environ, GLOG_v="3"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 1, out.stdout + out.stderr
    assert expected in out.stdout and "Traceback" not in out.stdout + out.stderr
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)  # the command's own CPU time
    assert cpu_s < 30, f"{cpu_s:.1f} CPU s for one config check"


def test_a_read_only_existing_run_dir_fails_config_check(tmp_path, capsys, monkeypatch):
    """A run dir named before the run (no {timestamp}) that exists read-only: refused before training.
    A read-only mount, because root writes through file modes."""
    run_dir = tmp_path / "exp" / "r1"
    run_dir.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(run_dir)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        os.chmod(run_dir, 0o555)
        if os.access(run_dir, os.W_OK):
            pytest.skip(f"cannot make a read-only dir here (root, and mount says: {mounted.stderr.strip()})")
    try:
        (tmp_path / "run.yaml").write_text(f"experiment: exp\nrun_name: r1\nexperiment_dir: {tmp_path / 'exp'}\n")
        monkeypatch.chdir(tmp_path)
        assert main(["config", "check", "run.yaml"]) == 1
        out = capsys.readouterr().out
        assert f"run.yaml:2: run_name: the run dir '{run_dir}' exists and cannot be written (" in out
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(run_dir)], check=False)
        else:
            os.chmod(run_dir, 0o755)
