"""The second hostile-config corpus: inputs ``config check`` once called ok although ``from_yaml`` or training
then refused them, inputs that hung or raised, and their relatives, written as classes rather than single cases.

``hostile_cases()`` returns ``{name: Case}``; ``Case.setup`` (optional) makes what the YAML points at in the case's
own directory (a file in the way, a symlink loop). Every ``expected`` text is ``run.yaml:LINE: KEY: ...`` with,
for a misspelt name, the nearest valid one. ``controls()`` are valid configs at each class's edge (a 255-byte
component, port 65535, 9,000 references): ``config check`` and ``from_yaml`` must both accept them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

Setup = Callable[[str], None]


@dataclass(frozen=True)
class Case:
    """A run.yaml, the texts one problem line must all hold (where, then what), and what to make beside it."""
    yaml: str
    expected: Tuple[str, ...]
    setup: Optional[Setup] = None


def _file(name: str) -> Setup:
    def make(root: str) -> None:
        with open(os.path.join(root, name), "w") as fh:
            fh.write("not a directory\n")
    return make


def _loop(root: str) -> None:
    os.symlink("loop_b", os.path.join(root, "loop_a"))
    os.symlink("loop_a", os.path.join(root, "loop_b"))


def _dangling(root: str) -> None:
    os.symlink("nowhere/at/all", os.path.join(root, "dangling"))


# Every key that names a directory: the YAML setting it to PATH (double-quoted: a \0 escape is a NUL) and where
# its problem is said.
_DIR_KEYS = {
    "output_dir": ('output_dir: "PATH/{run_name}"\n', "run.yaml:1: output_dir: "),
    "experiment_dir": ('experiment_dir: "PATH"\n', "run.yaml:1: experiment_dir: "),
    "dump_dir": ('health:\n  dump_dir: "PATH"\n', "run.yaml:2: health.dump_dir: "),
    "tensorboard_logdir": ('sinks:\n  tensorboard:\n    logdir: "PATH"\n', "run.yaml:3: sinks.tensorboard.logdir: "),
    "mindinsight_dir": ('sinks:\n  mindinsight:\n    summary_base_dir: "PATH"\n',
                        "run.yaml:3: sinks.mindinsight.summary_base_dir: "),
}


def path_cases() -> Dict[str, Case]:
    """Directories no run can make: each fault under each key that names a directory."""
    long_total = "/".join(["d" * 200] * 22)  # 22 components of 200 bytes: 4,421 bytes, over PATH_MAX
    faults = {
        "component-256": ("./" + "a" * 256, "is 256 bytes long; a file name holds at most 255 bytes", None),
        "component-5000": ("./" + "b" * 5000, "is 5,000 bytes long; a file name holds at most 255 bytes", None),
        "component-utf8-300-bytes": ("./" + "实" * 100, "is 300 bytes long", None),
        "path-4421-bytes": ("./" + long_total, "bytes long; a path holds at most 4095 bytes", None),
        "nul": ("./a\\0b", "holds a NUL character", None),
        "symlink-loop": ("./loop_a/run", "loop_a' is a symlink loop", _loop),
        "dangling-symlink": ("./dangling/run", "dangling' is a symlink to nothing ('nowhere/at/all')", _dangling),
        "file-in-the-way": ("./plain.txt/run", "plain.txt' is a file, not a directory", _file("plain.txt")),
        "file-is-the-dir": ("./plain.txt", "plain.txt' is a file, not a directory", _file("plain.txt")),
        "under-proc": ("/proc/msbridge-x/run", "cannot create '/proc/msbridge-x", None),
        "under-sys": ("/sys/msbridge-x", "cannot create '/sys/msbridge-x", None),
    }
    cases = {}
    for key, (yaml_text, where) in _DIR_KEYS.items():
        for fault, (path, what, setup) in faults.items():
            if key != "output_dir" and fault in ("component-utf8-300-bytes", "under-sys"):
                continue  # one key suffices for these
            cases[f"{key}-{fault}"] = Case(yaml_text.replace("PATH", path), (where, what), setup)
    cases["output-dir-literal-after-placeholder"] = Case(
        "output_dir: './runs/{run_name}" + "x" * 200 + "'\n", ("run.yaml:1: output_dir: ", "a component of"))
    cases["experiment-dir-literal-after-placeholder"] = Case(
        "experiment_dir: './e/{experiment}" + "y" * 130 + "'\n", ("run.yaml:1: experiment_dir: ", "a component of"))
    cases["output-dir-nul-after-placeholder"] = Case(
        'output_dir: "./runs/{run_name}/a\\0b"\n', ("run.yaml:1: output_dir: ", "holds a NUL character"))
    return cases


def _chain(links: int, last: str = "1") -> str:
    return "params:\n  a0: " + last + "\n" + "".join(f"  a{i}: ${{params.a{i - 1}}}\n" for i in range(1, links + 1))


def reference_cases() -> Dict[str, Case]:
    """``${}`` chains past the documented 10,000 references, and references that cannot resolve at depth."""
    refused = ("more than 10_000 ${...} references to follow",)
    deep_key = "params:\n  " + ": {".join(f"k{i}" for i in range(90)) + ": 1" + "}" * 89 + "\n"
    return {
        "chain-10001": Case(_chain(10_001), refused),
        "chain-20000": Case(_chain(20_000), refused),
        "chain-45000": Case(_chain(45_000), refused),
        "chain-20000-into-a-setting": Case(_chain(20_000) + "flush_steps: ${params.a20000}\n", refused),
        "chain-20000-in-a-list": Case("params:\n  a0: 1\n  l: [" + ", ".join(
            f"'${{params.l{i}}}'" for i in range(3)) + "]\n" + "".join(
            f"  l{i}: ${{params.l{i + 1}}}\n" for i in range(20_000)) + "  l20000: 1\n", refused),
        "chain-ending-in-a-cycle": Case(_chain(500, "${params.a500}"), ("run.yaml:2: params.a0: ", "reference cycle")),
        "chain-ending-nowhere": Case(_chain(5000, "${params.missing}"),
                                     ("run.yaml:2: params.a0: ", "'params.missing' is not defined")),
        "reference-into-90-levels-missing": Case(deep_key + "experiment: '${params." + ".".join(
            f"k{i}" for i in range(89)) + ".nope}'\n", ("run.yaml:", "experiment: ")),
        "reference-to-5000-char-key": Case("experiment: '${params." + "z" * 5000 + "}'\n",
                                           ("run.yaml:1: experiment: ",)),
        "reference-fan-out-30000": Case("params:\n  a: x\n  l: [" + ", ".join(["'${params.a}'"] * 30_000) + "]\n",
                                        refused),
    }


def unknown_name_cases() -> Dict[str, Case]:
    """Thousands of unknown names: each listed, answered in linear time (suggestions capped)."""
    many = 10_000
    return {
        "10000-unknown-sinks-list": Case("sinks: [" + ", ".join(f"sk{i}" for i in range(many)) + "]\n",
                                         ("run.yaml:1: sinks[0]: unknown sink 'sk0'",)),
        "10000-unknown-sinks-mapping": Case("sinks:\n" + "".join(f"  sk{i}: {{}}\n" for i in range(many)),
                                            ("run.yaml:2: sinks.sk0: unknown sink 'sk0'",)),
        "10000-misspelt-sinks": Case("sinks: [" + ", ".join(["tensorbord"] + [f"mlfow{i}" for i in range(many)])
                                     + "]\n", ("run.yaml:1: sinks[0]: unknown sink 'tensorbord'; did you mean "
                                               "'tensorboard'?",)),
        "20000-unknown-top-keys": Case("".join(f"flush_stepz{i}: 1\n" for i in range(20_000)),
                                       ("run.yaml:1: flush_stepz0: unknown key; did you mean 'flush_steps'?",)),
        "45000-unknown-top-keys": Case("".join(f"k{i}: 1\n" for i in range(45_000)), ("run.yaml:1: k0: unknown key",)),
        "20000-unknown-monitor-config-keys": Case("monitor_config:\n" + "".join(
            f"  local_norm_formt{i}: 1\n" for i in range(20_000)), ("run.yaml:2: monitor_config.local_norm_formt0: "
                                                                   "unknown key; did you mean 'local_norm_format'?",)),
        "20000-unknown-mlflow-options": Case("sinks:\n  mlflow:\n" + "".join(
            f"    trackng_uri{i}: x\n" for i in range(20_000)), ("run.yaml:3: sinks.mlflow.trackng_uri0: unknown "
                                                              "option; did you mean 'tracking_uri'?",)),
        "20000-unknown-health-keys": Case("health:\n" + "".join(f"  nonfinit{i}: true\n" for i in range(20_000)),
                                          ("run.yaml:2: health.nonfinit0: unknown key",)),
        "20000-unknown-alert-events": Case("alerts:\n  targets: [{url: 'https://example.com/h'}]\n  on: [" + ", ".join(
            f"stal{i}" for i in range(20_000)) + "]\n", ("run.yaml:", "alerts.on[0]: unknown event 'stal0'")),
        "1000-char-unknown-key": Case('"' + "q" * 1000 + '": 1\n', ("run.yaml:1: " + "q" * 1000 + ": unknown key",)),
        "unknown-key-then-misspelt-after-cap": Case("".join(f"zz{i}: 1\n" for i in range(300)) + "flush_stps: 5\n",
                                                    ("run.yaml:301: flush_stps: unknown key",)),
    }


def uri_cases() -> Dict[str, Case]:
    """Tracking URIs MLflow, or its first write, would refuse, and alert URLs no request can reach."""
    def uri(value: str, setup: Optional[Setup] = None, what: str = "") -> Case:
        return Case(f'sinks:\n  mlflow:\n    tracking_uri: "{value}"\n', ("run.yaml:3: sinks.mlflow.tracking_uri: ",
                                                                        what), setup)

    def alert(value: str, what: str, kind: str = "webhook") -> Case:
        return Case(f'alerts:\n  targets:\n    - type: {kind}\n      url: "{value}"\n',
                    ("run.yaml:4: alerts.targets[0].url: ", what))

    cases = {
        "uri-port-99999": uri("http://127.0.0.1:99999", what="port 99999 is not one of 1-65535"),
        "uri-port-65536": uri("http://127.0.0.1:65536", what="port 65536 is not one of 1-65535"),
        "uri-port-minus-1": uri("http://127.0.0.1:-1", what="port '-1' is not one of 1-65535"),
        "uri-port-0": uri("https://mlflow.example.com:0", what="port 0 is not one of 1-65535"),
        "uri-port-letters": uri("http://127.0.0.1:50OO", what="port '50OO' is not one of 1-65535"),
        "uri-port-40-digits": uri("http://h:" + "9" * 40, what="is not one of 1-65535"),
        "uri-ipv6-port-70000": uri("http://[::1]:70000", what="port 70000 is not one of 1-65535"),
        "uri-empty-host": uri("http://:5000", what="names no host"),
        "uri-empty-host-https-path": uri("https:///api", what="names no host"),
        "uri-only-userinfo": uri("http://user@:5000", what="names no host"),
        "uri-cr-lf": uri("http://127.0.0.1:5000/\\r\\nX-Injected: 1", what="control character '\\r'"),
        "uri-lf": uri("http://127.0.0.1:5000/\\n", what="control character '\\n'"),
        "uri-tab": uri("http://127.0.0.1:5000/\\t", what="control character '\\t'"),
        "uri-nul": uri("sqlite:///a\\0b.db", what="control character '\\x00'"),
        "uri-del": uri("http://127.0.0.1:5000/\\x7f", what="control character '\\x7f'"),
        "uri-sqlite-under-proc": uri("sqlite:////proc/mlflow.db", what="'/proc'"),
        "uri-sqlite-under-sys": uri("sqlite:////sys/x/mlflow.db", what="cannot create '/sys/x'"),
        "uri-sqlite-file-in-the-way": uri("sqlite:///plain.txt/mlflow.db", _file("plain.txt"),
                                          "plain.txt' is a file, not a directory"),
        "uri-sqlite-loop": uri("sqlite:///loop_a/mlflow.db", _loop, "loop_a' is a symlink loop"),
        "uri-sqlite-long-component": uri("sqlite:///" + "c" * 300 + "/mlflow.db", what="is 300 bytes long"),
        "uri-file-under-proc": uri("file:///proc/mlruns", what="is MLflow's filesystem store; MLflow 3 says"),
        "uri-path-under-proc": uri("/proc/mlruns", what="'/proc/mlruns'"),
        "uri-postgres-port-99999": uri("postgresql://u@db:99999/mlflow", what="port 99999 is not one of 1-65535"),
        "uri-mysql-no-host": uri("mysql+pymysql://:3306/mlflow", what="names no host"),
        "uri-unknown-scheme-near": uri("sqlit:///mlflow.db", what="did you mean 'sqlite'?"),
    }
    cases.update({
        "alert-port-70000": alert("http://127.0.0.1:70000/hook", "port 70000 is not one of 1-65535"),
        "alert-port-minus-1": alert("https://hooks.example.com:-1/x", "port '-1' is not one of 1-65535"),
        "alert-empty-host": alert("https://:443/x", "names no host"),
        "alert-cr-lf": alert("https://hooks.example.com/x\\r\\nHost: evil", "control character '\\r'"),
        "alert-slack-port-0": alert("https://hooks.slack.com:0/services/T/B/X", "port 0 is not one", "slack"),
        "alert-lark-no-host": alert("https:///open-apis/bot/v2/hook/x", "names no host", "lark"),
        "alert-not-http": alert("ftp://hooks.example.com/x", "expected an http:// or https:// URL"),
    })
    return cases


def hostile_cases() -> Dict[str, Case]:
    """The whole new corpus."""
    return {**path_cases(), **reference_cases(), **unknown_name_cases(), **uri_cases()}


def controls() -> Dict[str, Case]:
    """Valid configs at each class's edge: accepted by ``config check`` and by ``from_yaml`` alike."""
    return {
        "component-255": Case('output_dir: "./' + "a" * 255 + '/{run_name}"\n', ()),
        "literal-after-placeholder-fits": Case("output_dir: './runs/{run_name}" + "x" * 120 + "'\n", ()),
        "chain-9000": Case(_chain(9000) + "flush_steps: ${params.a9000}\n", ()),
        "uri-port-65535": Case('sinks:\n  mlflow:\n    tracking_uri: "http://127.0.0.1:65535"\n', ()),
        "uri-sqlite-relative": Case('sinks:\n  mlflow:\n    tracking_uri: "sqlite:///store/mlflow.db"\n', ()),
        "alert-port-1": Case('alerts:\n  targets:\n    - url: "http://127.0.0.1:1/hook"\n', ()),
        "existing-symlink-to-dir": Case('output_dir: "./link/{run_name}"\n', (), lambda root: (
            os.mkdir(os.path.join(root, "real")), os.symlink("real", os.path.join(root, "link")))),
    }
