"""The ``alerts:`` section is checked before training like every other setting: file:line, key, nearest key."""
from __future__ import annotations

import pytest

from msbridge import ConfigError
from msbridge.config.load import load_config

GOOD = """\
experiment: tiny
alerts:
  targets:
    - {type: webhook, url: "https://ops.example.com/hook"}
    - {type: lark, url: "https://open.feishu.cn/open-apis/bot/v2/hook/abc", secret: "s3"}
  on: [nonfinite, stop, stall, failed]
  stall_seconds: 900
"""


def problems(tmp_path, text, name="monitor.yaml"):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    return err.value.problems


def test_the_documented_shape_loads_with_a_bare_on_key(tmp_path):
    (tmp_path / "m.yaml").write_text(GOOD)
    spec = load_config(str(tmp_path / "m.yaml")).alert_spec
    assert [(t.index, t.type, t.secret) for t in spec.targets] == [(0, "webhook", None), (1, "lark", "s3")]
    assert spec.on == {"nonfinite", "stop", "stall", "failed"} and spec.stall_seconds == 900
    default = load_config({"alerts": {"targets": [{"type": "slack", "url": "https://hooks.slack.com/x"}]}})
    assert default.alert_spec.on == {"nonfinite", "stop", "stall", "failed", "undelivered"}
    assert default.alert_spec.stall_seconds is None  # derived from the step times


def test_unknown_keys_types_and_on_values_name_file_line_and_the_nearest_key(tmp_path):
    found = problems(tmp_path, """\
experiment: tiny
alerts:
  targets:
    - {type: slak, url: "https://x/hook"}
    - {type: slack, url: "https://x/hook", secret: "s"}
    - {typ: webhook, url: "https://x/hook"}
  on: [nonfinite, stal]
  stall_second: 30
  retries: many
""")
    text = "\n".join(found)
    assert "monitor.yaml:4: alerts.targets[0].type: expected one of webhook, slack, lark, dingtalk, wecom, got 'slak'" \
        in text
    assert "monitor.yaml:5: alerts.targets[1].secret: only lark and dingtalk bots sign requests" in text
    assert "monitor.yaml:6: alerts.targets[2].typ: unknown option; did you mean 'type'?" in text
    assert "monitor.yaml:7: alerts.on[1]: unknown event 'stal'; did you mean 'stall'?" in text
    assert "monitor.yaml:8: alerts.stall_second: unknown key; did you mean 'stall_seconds'?" in text
    assert "monitor.yaml:9: alerts.retries: expected an integer >= 0 and < 20, got 'many'" in text
    assert len(found) == 6


def test_a_target_without_url_or_with_a_non_http_url_is_refused(tmp_path):
    found = problems(tmp_path, "alerts:\n  targets:\n    - {type: wecom}\n    - {type: wecom, url: 'ftp://x'}\n"
                               "  stall_seconds: 0\n")
    text = "\n".join(found)
    assert "alerts.targets[0]: needs url" in text and "alerts.targets[1].url: expected an http:// or https:// URL" \
        in text and "alerts.stall_seconds: expected null or a number > 0" in text


def test_the_mindformers_entry_takes_the_same_section(tmp_path):
    (tmp_path / "run.yaml").write_text("""\
run_mode: train
model: {model_config: {seq_length: 32}}
callbacks:
  - type: MFLossMonitor
  - type: MSBridgeMonitor
    experiment: mf
    alerts:
      targets: [{type: dingtalk, url: "https://oapi.dingtalk.com/robot/send?access_token=T", secret: SEC1}]
      on: [nonfinite, stall]
""")
    spec = load_config(str(tmp_path / "run.yaml")).alert_spec
    assert [(t.type, t.secret) for t in spec.targets] == [("dingtalk", "SEC1")] and spec.on == {"nonfinite", "stall"}
    (tmp_path / "bad.yaml").write_text((tmp_path / "run.yaml").read_text().replace("on: [", "onn: ["))
    with pytest.raises(ConfigError) as err:
        load_config(str(tmp_path / "bad.yaml"))
    assert "bad.yaml:9: callbacks[1].alerts.onn: unknown key; did you mean 'on'?" in str(err.value)


def test_a_wrong_typed_url_or_secret_is_reported_without_its_value(tmp_path):
    found = problems(tmp_path, "alerts:\n  targets:\n    - {type: lark, url: 81234567, secret: 99887766}\n")
    text = "\n".join(found)
    assert "alerts.targets[0].url: expected a non-empty string (the value is not shown" in text
    assert "alerts.targets[0].secret: expected null or a non-empty string" in text
    assert "81234567" not in text and "99887766" not in text
