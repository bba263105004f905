"""Replay, plot and diagnose salvage a damaged log: a bad line is skipped with one warning naming file:line
and the count, and reported; ``--strict`` refuses instead; wrong types are a clear message, never a traceback."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from helpers.runs import make_records, make_run
from msbridge.adapters.jsonl_sink import JsonlSink
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from msbridge import BridgeMonitor
from msbridge.cli.main import main
from msbridge.demo import demo_config, train
from msbridge.sinks.runlog import RunLogError, read_rank_file, read_run

STEPS = 40


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real 40-step demo run with jsonl only; each test damages its own copy."""
    out = tmp_path_factory.mktemp("salvage")
    cfg = demo_config(str(out), {"experiment": "salvage", "run_name": "clean", "sinks": ["jsonl"]})
    cfg["params"]["train"]["eval_every"] = 0  # one line per step: the tests count lines (evaluations: test_eval_hooks)
    monitor = BridgeMonitor(cfg, progress=False)
    train(monitor, STEPS, cfg["params"])
    return Path(monitor.run_dir)


def damaged(trained: Path, tmp_path: Path) -> Path:
    """A copy of the run whose log has the faults of a full disk and of hands: step 10 cut with step 11 glued
    onto it (line 11), step 20's values a list (line 20), and a last line cut by a kill."""
    run_dir = tmp_path / "salvage" / "clean"
    shutil.copytree(trained, run_dir)
    wal = run_dir / "metrics" / "rank_0.jsonl"
    lines = wal.read_text().splitlines(keepends=True)
    assert json.loads(lines[10])["step"] == 10 and json.loads(lines[20])["step"] == 20
    lines[10] = lines[10][:57] + lines[11]  # what the old writer left on a full disk
    del lines[11]
    obj = json.loads(lines[19])
    assert obj["step"] == 20
    obj["values"] = list(obj["values"].values())
    lines[19] = json.dumps(obj) + "\n"
    wal.write_text("".join(lines) + '{"type":"metrics","step":41,"ra')
    return run_dir


def salvage_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "bad line(s)" in r.getMessage()]


@pytest.mark.slow
def test_replay_skips_bad_lines_with_one_warning_and_reports_them(trained, tmp_path, caplog, capsys):
    run_dir = damaged(trained, tmp_path)
    caplog.set_level(logging.WARNING, logger="msbridge")
    assert main(["replay", str(run_dir), "--to", "tensorboard"]) == 0
    (warning,) = salvage_warnings(caplog)
    assert warning.startswith(f"msbridge: {run_dir}/metrics/rank_0.jsonl:11: not a JSON line; skipped 2 bad line(s)")
    assert "(line 11, 20)" in warning and "--strict" in warning
    out = capsys.readouterr().out
    assert "2 bad line(s) skipped" in out and "1 cut last line(s) skipped" in out
    acc = EventAccumulator(str(tmp_path / "salvage" / "tensorboard" / "clean" / "rank_0"), size_guidance={"scalars": 0})
    acc.Reload()
    kept = [s for s in range(1, STEPS + 1) if s not in (10, 11, 20)]
    assert [e.step for e in acc.Scalars("train/loss")] == kept, "every good line replayed, the bad ones left out"


def test_plot_and_diagnose_salvage_and_say_so(trained, tmp_path, caplog, capsys):
    run_dir = damaged(trained, tmp_path)
    caplog.set_level(logging.WARNING, logger="msbridge")
    assert main(["diagnose", str(run_dir), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == [1, STEPS], "the good lines around the bad ones are all read"
    notes = " ".join(report["notes"])
    assert "rank_0.jsonl: skipped 2 bad line(s), the first at line 11 (not a JSON line)" in notes
    assert "the last line was cut" in notes
    assert main(["plot", str(run_dir), "-o", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "skipped 2 bad line(s)" in out and (tmp_path / "p.png").stat().st_size > 0
    assert len(salvage_warnings(caplog)) == 2, "one warning per reading command"


@pytest.mark.parametrize("command", [["replay", "--to", "tensorboard"], ["plot"], ["diagnose"]])
def test_strict_refuses_a_bad_line_naming_it(trained, tmp_path, capsys, command):
    run_dir = damaged(trained, tmp_path)
    assert main([command[0], str(run_dir), *command[1:], "--strict"]) == 2
    err = capsys.readouterr().err
    assert "rank_0.jsonl:11: not a JSON line (without --strict the line is skipped)" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("line, reason", [
    (b'{"type":"metrics","step":3,"rank":0,"time":1.0,"values":[1.0,2.0]}', '"values" is a list, not an object'),
    (b'{"type":"metrics","step":"3","rank":0,"time":1.0,"values":{}}', '"step" is a string, not an integer'),
    (b'{"type":"metrics","rank":0,"time":1.0,"values":{}}', '"step" is missing, not an integer'),
    (b'{"type":"metrics","step":3,"rank":0,"time":1.0,"values":{"train/loss":"2.5"}}',
     '"values"."train/loss" is a string, not a number or null'),
    (b'{"type":"event","kind":"anomaly","step":3,"rank":0,"detail":[1]}', '"detail" is a list, not an object'),
    (b'{"type":"event","kind":7,"step":3,"rank":0}', '"kind" is a number, not a string'),
    (b'{"type":null}', '"type" is null, not "header", "metrics" or "event"'),
    (b'[1, 2]', "a list, not a JSON object"),
    (b'{"type":"metrics","step":3,\xff\xfe}', "not UTF-8 (byte 27 of the line)"),
    (b"[" * 100000 + b"]" * 100000, "not a JSON line"),
    (b'{"type":"metrics","step":' + b"1" + b"0" * 30 + b',"rank":0,"time":1.0,"values":{}}',
     '"step" is an integer of 31 digits, outside 0 .. 9_007_199_254_740_992'),
    (b'{"type":"metrics","step":-5,"rank":0,"time":1.0,"values":{}}', '"step" is -5, outside 0 .. '),
    (b'{"type":"event","kind":"anomaly","step":-1,"rank":0,"detail":{}}', '"step" is -1, outside 0 .. '),
    (b'{"type":"metrics","step":3,"rank":-1,"time":1.0,"values":{}}', '"rank" is -1, outside 0 .. 10_000_000'),
    (b'{"type":"metrics","step":3,"rank":0,"time":1.0,"values":{"train/loss":Infinity}}',
     '"values"."train/loss" is inf, not a finite number or null'),
    (b'{"type":"metrics","step":3,"rank":0,"time":1.0,"values":{"train/loss":1e999}}',
     '"values"."train/loss" is inf, not a finite number or null'),
    (b'{"type":"metrics","step":3,"rank":0,"time":NaN,"values":{}}', '"time" is nan, not a finite number'),
])
def test_wrong_types_are_a_clear_reason_never_a_traceback(tmp_path, line, reason):
    sink = JsonlSink()
    sink.open(make_run(tmp_path))
    sink.write(make_records([1, 2]), [])
    sink.close()
    with open(sink.path, "ab") as fh:
        fh.write(line + b"\n")
    sink = JsonlSink()
    sink.open(make_run(tmp_path))
    sink.write(make_records([4]), [])
    sink.close()
    log = read_rank_file(sink.path)
    assert [r.step for r in log.records] == [1, 2, 4]
    assert log.skipped == [(4, log.skipped[0][1])] and log.skipped[0][1].startswith(reason)
    with pytest.raises(RunLogError, match=":4: "):
        read_run(str(Path(sink.path).parents[1]), strict=True)


def test_a_bad_header_is_still_a_refusal(tmp_path):
    path = tmp_path / "metrics" / "rank_0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"type":"header","schema_version":1,"rank":"0"}\n')
    with pytest.raises(RunLogError, match="no header line"):
        read_run(str(tmp_path))


def _edit_log(trained: Path, tmp_path: Path, edit) -> Path:
    run_dir = tmp_path / "salvage" / "clean"
    shutil.copytree(trained, run_dir)
    wal = run_dir / "metrics" / "rank_0.jsonl"
    wal.write_text("".join(edit(wal.read_text().splitlines(keepends=True))))
    return run_dir


@pytest.mark.parametrize("step", [10 ** 30, -5])
@pytest.mark.parametrize("command", [["diagnose"], ["plot"], ["replay", "--to", "tensorboard"],
                                     ["replay", "--to", "mlflow"]])
def test_an_out_of_range_step_is_one_line_naming_it_in_every_tool(trained, tmp_path, caplog, capsys, step, command):
    """Before: tracebacks in diagnose, plot and replay --to tensorboard, and "unreachable" from replay --to mlflow."""
    def edit(lines):
        obj = json.loads(lines[5])
        assert obj["step"] == 5
        lines[5] = lines[5].replace('"step":5,', f'"step":{step},', 1)
        return lines

    run_dir = _edit_log(trained, tmp_path, edit)
    caplog.set_level(logging.WARNING, logger="msbridge")
    extra = ["--out", str(tmp_path / "plot.png")] if command == ["plot"] else []
    assert main([command[0], str(run_dir), *command[1:], *extra]) == 0
    out = capsys.readouterr()
    (warning,) = salvage_warnings(caplog)
    assert f"rank_0.jsonl:6: \"step\" is " in warning and "outside 0 .. 9_007_199_254_740_992" in warning
    assert "Traceback" not in out.out + out.err and "unreachable" not in out.out + out.err + caplog.text
    if command[0] == "replay":
        assert f"replayed {STEPS - 1} records" in out.out


def test_a_garbled_header_is_rebuilt_from_the_lines_after_it(trained, tmp_path, caplog, capsys):
    run_dir = _edit_log(trained, tmp_path, lambda lines: ['{"type":"header","schema_ver\n'] + lines[1:])
    caplog.set_level(logging.WARNING, logger="msbridge")
    run = read_run(str(run_dir))
    log = run.ranks[0]
    assert [r.step for r in log.records] == list(range(1, STEPS + 1))
    original = json.loads((trained / "run.json").read_text())
    assert log.header["salvaged"] is True and log.header["rank"] == 0 and log.header["world_size"] == 1
    assert log.header["run_name"] == original["run_name"] and log.header["run_id"] == original["run_id"]
    assert log.skipped[0][0] == 1 and "the header; rebuilt from the 40 metrics lines after it" in log.skipped[0][1]
    for command in (["diagnose"], ["replay", "--to", "tensorboard"]):
        assert main([command[0], str(run_dir), *command[1:]]) == 0
    assert "replayed 40 records" in capsys.readouterr().out
    with pytest.raises(RunLogError, match="rank_0.jsonl:1: not a JSON line"):
        read_run(str(run_dir), strict=True)


@pytest.mark.parametrize("command", [["replay", "--to", "tensorboard"], ["plot"], ["diagnose"]])
def test_strict_refuses_a_step_written_twice(trained, tmp_path, capsys, command):
    run_dir = _edit_log(trained, tmp_path, lambda lines: lines[:8] + [lines[7]] + lines[8:])
    assert [r.step for r in read_run(str(run_dir)).ranks[0].records].count(7) == 2  # read as written without it
    assert main([command[0], str(run_dir), *command[1:], "--strict"]) == 2
    err = capsys.readouterr().err
    assert "rank_0.jsonl:9: step 7 is written twice (first at line 8: " in err and "Traceback" not in err
