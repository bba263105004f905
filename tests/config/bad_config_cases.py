"""The generated part of the bad-config corpus: hostile files (bombs, huge numbers, tags) and every setting,
sink option and health option with a value it may not hold or a misspelt name.

``generated_cases()`` returns ``{name: (run.yaml text, expected text in a problem line)}``; each expected
text starts with ``run.yaml:LINE: KEY:`` (or says what is wrong with the file) and, for a misspelt key,
ends with the nearest valid key.
"""
from __future__ import annotations

from typing import Dict, Tuple

from msbridge.adapters.mlflow_sink import MlflowSink
from msbridge.config.settings import OPTIONS
from msbridge.health.detectors import DETECTORS

Case = Tuple[str, str]

# Every setting of a plain type, as declared: a new one is in these families the moment it is declared.
_INT_FIELDS = tuple(name for name, option in OPTIONS.items() if option.type is int)
_FLOAT_FIELDS = tuple(name for name, option in OPTIONS.items() if option.type is float)
_BOOL_FIELDS = tuple(name for name, option in OPTIONS.items() if option.type is bool)
_TEXT_FIELDS = tuple(name for name, option in OPTIONS.items()
                     if option.type is str and option.default is not None and option.what is None)


def _misspelt(name: str) -> str:
    """``name`` with two neighbouring letters swapped (a typo difflib still matches)."""
    i = len(name) // 2
    return name[:i - 1] + name[i] + name[i - 1] + name[i + 1:] if name[i] != name[i - 1] else name + "x"


def hostile_files() -> Dict[str, Case]:
    """The configs a fault run found tracebacks and hangs in (huge numbers, regexes, bombs), and their relatives."""
    doubling = "params:\n  a0: xxxxxxxxxxxxxxxx\n" + "".join(
        f"  a{i}: ${{params.a{i - 1}}}${{params.a{i - 1}}}\n" for i in range(1, 60))
    list_bomb = "params:\n  a0: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" + "".join(
        f"  a{i}: ['${{params.a{i - 1}}}', '${{params.a{i - 1}}}', '${{params.a{i - 1}}}']\n" for i in range(1, 40))
    mapping_bomb = "params:\n  a0: {x: 1, y: 2, z: 3}\n" + "".join(
        f"  a{i}: {{l: '${{params.a{i - 1}}}', r: '${{params.a{i - 1}}}'}}\n" for i in range(1, 40))
    many_refs = "params:\n  a: 1\n  refs: [" + ", ".join(["'${params.a}'"] * 12_000) + "]\n"
    return {
        "hex-int-6000-digits": ("flush_steps: 0x" + "f" * 6000 + "\n", "run.yaml:1: flush_steps: an integer of about"),
        "hex-int-param": ("params:\n  seed: 0x" + "f" * 6000 + "\n", "run.yaml:2: params.seed: an integer of about"),
        "decimal-int-5000-digits": ("params:\n  n: " + "9" * 5000 + "\n", "run.yaml:2: params.n: an integer of about"),
        "int-41-digits": ("params:\n  n: " + "1" * 41 + "\n", "run.yaml:2: params.n: an integer of about 41 digits"),
        "huge-int-key": ("params:\n  " + "7" * 500 + ": 1\n", "run.yaml:2: params: an integer of about"),
        "regex-repeat-2-32": ("layer_norms: 'a{4294967296}'\n", "run.yaml:1: layer_norms: 'a{4294967296}' is not a "
                              "valid regular expression: a repeat count above 65535"),
        "regex-repeat-range": ("histograms: 'a{1,99999999999}'\n", "run.yaml:1: histograms: 'a{1,99999999999}' is "
                               "not a valid regular expression"),
        "regex-1000-nested-groups": ("layer_norms: '" + "(" * 1000 + "a" + ")" * 1000 + "'\n",
                                     "run.yaml:1: layer_norms:"),
        "regex-60-nested-groups": ("layer_norms: '" + "(" * 60 + "a" + ")" * 60 + "'\n",
                                   "is not a valid regular expression: nested deeper than 50 groups"),
        "regex-too-long": ("histograms: '" + "a|" * 600 + "b'\n", "run.yaml:1: histograms:"),
        "group-regex-nested": ("layer_norms: x\nlayer_norms_group: '" + "(" * 80 + ")" * 80 + "'\n",
                               "run.yaml:2: layer_norms_group:"),
        "string-doubling-bomb": (doubling, "makes the config larger than 100_000 keys and items and 4 MiB of text"),
        "list-bomb": (list_bomb, "makes the config larger than 100_000 keys and items and 4 MiB of text"),
        "mapping-bomb": (mapping_bomb, "makes the config larger than 100_000 keys and items and 4 MiB of text"),
        "too-many-references": (many_refs, "more than 10_000 ${...} references to follow"),
        "150k-keys-in-params": ("params:\n" + "".join(f"  k{i}: {i}\n" for i in range(150_000)),
                                "run.yaml:50000: more than 100000 keys and items; refused"),
        "150k-top-level-keys": ("".join(f"k{i}: {i}\n" for i in range(150_000)),
                                "run.yaml:50000: more than 100000 keys and items; refused"),
        "200k-list-items": ("params:\n  l: [" + ", ".join(["1"] * 200_000) + "]\n",
                            "run.yaml:2: more than 100000 keys and items; refused"),
    }


def wrongly_accepted() -> Dict[str, Case]:
    """Values that were accepted and failed later (during training, or never): options, tags, secrets in names."""
    return {
        "close-timeout-inf": ("sinks:\n  mlflow:\n    close_timeout: .inf\n",
                              "run.yaml:3: sinks.mlflow.close_timeout: expected a finite number > 0 and < 3600, "
                              "got inf"),
        "close-timeout-zero": ("sinks:\n  mlflow:\n    close_timeout: 0\n",
                               "run.yaml:3: sinks.mlflow.close_timeout: expected a number > 0 and < 3600, got 0"),
        "backoff-initial-above-max": ("sinks:\n  mlflow:\n    backoff_initial: 100\n    backoff_max: 10\n",
                                      "run.yaml:3: sinks.mlflow.backoff_initial: must be <= backoff_max, which is 10"),
        "backoff-initial-above-default-max": ("sinks:\n  mlflow:\n    backoff_initial: 100\n",
                                              "run.yaml:3: sinks.mlflow.backoff_initial: must be <= backoff_max, "
                                              "which is 60.0 (its default)"),
        "tracking-uri-words": ("sinks:\n  mlflow:\n    tracking_uri: 'not a uri at all'\n",
                               "run.yaml:3: sinks.mlflow.tracking_uri: 'not a uri at all' is neither a URI"),
        "tracking-uri-bad-scheme": ("sinks:\n  mlflow:\n    tracking_uri: 'htp://127.0.0.1:5000'\n",
                                    "run.yaml:3: sinks.mlflow.tracking_uri: scheme 'htp' is not one MLflow reads"),
        "tracking-uri-no-host": ("sinks:\n  mlflow:\n    tracking_uri: 'http://'\n",
                                 "run.yaml:3: sinks.mlflow.tracking_uri: 'http://' names no host"),
        "http-retries-10-12": ("sinks:\n  mlflow:\n    http_retries: 1000000000000\n",
                               "run.yaml:3: sinks.mlflow.http_retries: expected null or an integer >= 0 and < 100"),
        "threshold-inf": ("health:\n  grad_norm_spike:\n    threshold: .inf\n",
                          "run.yaml:3: health.grad_norm_spike.threshold: expected null or a finite "
                          "number > 0, got inf"),
        "unterminated-reference": ("params:\n  lr: 0.1\n  x: 'lr=${params.lr'\n",
                                   "run.yaml:3: params.x: 'lr=${params.lr' has a ${ that no } closes"),
        "nested-reference": ("params:\n  k: lr\n  lr: 1\n  x: '${params.${params.k}}'\n",
                             "run.yaml:4: params.x: '${params.${params.k}}' has a ${ that no } closes"),
        "unterminated-in-run-name": ("run_name: 'r-${experiment'\n", "run.yaml:1: run_name: 'r-${experiment' has a"),
        "python-apply-list": ("params:\n  x: !!python/object/apply:os.system [ls]\n",
                              "run.yaml:2: params.x: the YAML tag '!!python/object/apply:os.system' is not allowed"),
        "python-tuple": ("params:\n  t: !!python/tuple [1, 2]\n",
                         "run.yaml:2: params.t: the YAML tag '!!python/tuple' is not allowed"),
        "python-object-mapping": ("params: !!python/object:argparse.Namespace {a: 1}\n",
                                  "run.yaml:1: params: the YAML tag '!!python/object:argparse.Namespace' is not"),
        "local-tag": ("experiment: !Ref name\n", "run.yaml:1: experiment: the YAML tag '!Ref' is not allowed"),
        "set-tag": ("params: !!set {a, b}\n", "run.yaml:1: params: the YAML tag '!!set' is not allowed"),
        "omap-tag": ("params: !!omap [a: 1]\n", "run.yaml:1: params: the YAML tag '!!omap' is not allowed"),
        "tag-on-key": ("params:\n  !!python/name:os.system x: 1\n", "run.yaml:2: params: the YAML tag"),
        "run-name-secret-template": ("run_name: 'r-{api_key}'\nparams:\n  api_key: s3cr3t\n",
                                     "run.yaml:1: run_name: 'r-{api_key}' references {api_key}, which looks like a "
                                     "secret"),
        "run-name-secret-dotted": ("run_name: 'r-{params.hf_token}'\nparams:\n  hf_token: s3cr3t\n",
                                   "references {params.hf_token}, which looks like a secret"),
        "run-name-secret-interpolated": ("run_name: 'r-${params.password}'\nparams:\n  password: s3cr3t\n",
                                         "run.yaml:1: run_name: ${params.password} puts a secret into a setting"),
        "experiment-secret-interpolated": ("experiment: '${params.db.credentials}'\nparams:\n  db:\n    "
                                           "credentials: s3cr3t\n", "run.yaml:1: experiment: ${params.db.credentials}"),
        "tag-secret-interpolated": ("tags:\n  owner: 'x-${params.api_key}'\nparams:\n  api_key: s3cr3t\n",
                                    "run.yaml:2: tags.owner: ${params.api_key} puts a secret"),
    }


def value_cases() -> Dict[str, Case]:
    """Every top-level setting with a value of the wrong type or range."""
    cases: Dict[str, Case] = {}
    for name in _INT_FIELDS:
        option, null = OPTIONS[name], "null or " if OPTIONS[name].default is None else ""
        cases[f"{name}-negative"] = (f"{name}: -5\n", f"run.yaml:1: {name}: expected")
        cases[f"{name}-float"] = (f"{name}: 2.5\n", f"run.yaml:1: {name}: expected")
        cases[f"{name}-huge"] = (f"{name}: 100000000000000\n", f"run.yaml:1: {name}: expected {null}an integer >= "
                                 f"{option.low} and <= {option.high:_}, got 100000000000000")
        cases[f"{name}-list"] = (f"{name}: [1]\n", f"run.yaml:1: {name}: expected")
    for name in _FLOAT_FIELDS:  # each is above 0 and below a declared limit
        option, null = OPTIONS[name], "null or " if OPTIONS[name].default is None else ""
        high = f"{'<' if option.high_open else '<='} {int(option.high) if option.high >= 10_000 else option.high:_}"
        cases[f"{name}-inf"] = (f"{name}: .inf\n", f"run.yaml:1: {name}: expected {null}a finite number > 0 and "
                                                   f"{high}, got inf")
        cases[f"{name}-nan"] = (f"{name}: .nan\n", f"run.yaml:1: {name}: expected {null}a finite number > 0 and "
                                                   f"{high}, got nan")
        cases[f"{name}-zero"] = (f"{name}: 0\n", f"run.yaml:1: {name}: expected {null}a number > 0 and {high}, got 0")
        cases[f"{name}-text"] = (f"{name}: soon\n", f"run.yaml:1: {name}: expected {null}a number > 0 and {high}, "
                                                    "got 'soon'")
    for name in _BOOL_FIELDS:
        cases[f"{name}-text"] = (f"{name}: 'on please'\n", f"run.yaml:1: {name}: expected true or false")
    for name in _TEXT_FIELDS:
        cases[f"{name}-list"] = (f"{name}: [a]\n", f"run.yaml:1: {name}: expected a non-empty string")
    cases["system-interval-inf"] = ("system: {interval_s: .inf}\n", "run.yaml:1: system.interval_s: expected a finite")
    cases["straggler-margin-inf"] = ("straggler: {margin: .inf}\n", "run.yaml:1: straggler.margin: expected a finite")
    return cases


def misspelt_keys() -> Dict[str, Case]:
    """Every setting, MLflow option and health check misspelt: each problem names the nearest valid key."""
    cases: Dict[str, Case] = {}
    for name in OPTIONS:
        typo = _misspelt(name)
        cases[f"typo-{name}"] = (f"{typo}: 1\n", f"run.yaml:1: {typo}: unknown key; did you mean '{name}'?")
    for option in MlflowSink.options:
        typo = _misspelt(option)
        cases[f"typo-mlflow-{option}"] = (f"sinks:\n  mlflow:\n    {typo}: 1\n", f"run.yaml:3: sinks.mlflow.{typo}: "
                                          f"unknown option; did you mean '{option}'?")
    for check in DETECTORS:
        typo = _misspelt(check)
        cases[f"typo-health-{check}"] = (f"health:\n  {typo}: {{}}\n", f"run.yaml:2: health.{typo}: unknown key; did "
                                         f"you mean '{check}'?")
    return cases


def mlflow_option_values() -> Dict[str, Case]:
    """Every MLflow option given a value it may not hold (a float one infinite, any other one a list)."""
    cases: Dict[str, Case] = {}
    for option, declared in MlflowSink.options.items():
        bad = ".inf" if declared.type is float else "[1]"
        cases[f"mlflow-{option}-bad"] = (f"sinks:\n  mlflow:\n    {option}: {bad}\n",
                                         f"run.yaml:3: sinks.mlflow.{option}: expected")
    return cases


def generated_cases() -> Dict[str, Case]:
    """All generated cases (names are unique across the families)."""
    out: Dict[str, Case] = {}
    for family in (hostile_files(), wrongly_accepted(), value_cases(), misspelt_keys(), mlflow_option_values()):
        assert not set(out) & set(family)
        out.update(family)
    return out
