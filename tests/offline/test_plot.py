"""msbridge plot: panels, scales, red marks for events / NaN / findings, bad input, a real run."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from helpers import synthetic_runs as sr

from msbridge.cli.main import main
from msbridge.errors import MsbridgeError
from msbridge.names import GRAD_NORM, LOSS
from msbridge.offline.diagnose import diagnose
from msbridge.offline.plot import RED, draw, plot_run
from msbridge.sinks.runlog import read_run

pytest.importorskip("matplotlib")
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.image import imread  # noqa: E402


def figure(tmp_path, scenario, with_report=True):
    run = read_run(sr.write_run(tmp_path / scenario.name, scenario))
    return draw(run, diagnose(run) if with_report else None)


def panels(fig):
    """Title -> axes, for the data panels (the footer has no title)."""
    return {ax.get_title().split(" (")[0]: ax for ax in fig.axes if ax.get_title()}


def labels(ax):
    return ax.get_legend_handles_labels()[1]


def line(ax, prefix):
    return next(li for li in ax.get_lines() if (li.get_label() or "").startswith(prefix))


def footer(fig):
    return "\n".join(t.get_text() for t in fig.axes[-1].texts)


def test_single_rank_panels_titles_units_and_scales(tmp_path):
    fig = figure(tmp_path, sr.clean())
    p = panels(fig)
    assert list(p) == ["Loss", "Gradient norm", "Learning rate", "Throughput"]
    assert p["Gradient norm"].get_yscale() == "log"  # always, when positive
    assert p["Loss"].get_yscale() == "linear"  # 4.0 -> 0.6 is less than a decade
    assert [ax.get_ylabel() for ax in p.values()] == ["loss", "L2 norm of gradients", "learning rate", "tokens/s"]
    assert p["Throughput"].get_xlabel() == "training step"
    assert {"loss", "loss EMA"} <= set(labels(p["Loss"]))
    assert fig._suptitle.get_text().startswith("synthetic-clean  (synthetic)")
    assert "diagnose: no findings" in footer(fig)


def test_loss_spanning_more_than_a_decade_is_log(tmp_path):
    scenario = sr.clean()
    scenario.ranks[0][LOSS] = scenario.ranks[0][LOSS] ** 3  # 64 -> 0.2
    assert panels(figure(tmp_path, scenario))["Loss"].get_yscale() == "log"


def test_per_rank_losses_are_overlaid_and_the_outlier_is_red(tmp_path):
    fig = figure(tmp_path, sr.slow_rank(rank=2, world_size=4))
    ax = panels(fig)["Local loss per rank"]
    assert [lab for lab in labels(ax) if lab.startswith("rank")] == [
        "rank 0", "rank 1", "rank 2 - above the others", "rank 3"]
    assert to_rgb(line(ax, "rank 2").get_color()) == to_rgb(RED)
    assert "rank_outlier [high]: rank 2's local loss" in footer(fig)


def test_many_ranks_share_one_legend_entry(tmp_path):
    ax = panels(figure(tmp_path, sr.slow_rank(rank=5, world_size=12)))["Local loss per rank"]
    assert len(ax.get_lines()) == 12
    assert [lab for lab in labels(ax) if "rank" in lab] == ["other ranks (11)", "rank 5 - above the others"]


def test_footer_findings_and_notes_red_skipped_checks_grey(tmp_path):
    run_dir = sr.write_run(tmp_path / "run", sr.without(sr.nan_steps(), GRAD_NORM))
    sr.cut_last_line(run_dir)
    run = read_run(run_dir)
    texts = draw(run, diagnose(run)).axes[-1].texts
    colours = {t.get_text().split(":")[0]: to_rgb(t.get_color()) == to_rgb(RED) for t in texts}
    assert colours == {"nonfinite [high]": True, "note": True, "skipped lr_too_high, periodic_grad_spikes": False,
                       "skipped rank_outlier": False, "skipped straggler": False, "skipped first_anomaly": False}


def test_several_ranks_smooth_the_global_loss_not_rank0s(tmp_path):
    ax = panels(figure(tmp_path, sr.slow_rank(rank=0, world_size=2, excess=1.0)))["Loss"]
    assert {"global loss", "global loss EMA"} <= set(labels(ax))
    global_, ema = line(ax, "global loss").get_ydata(), line(ax, "global loss EMA").get_ydata()
    assert abs(ema[-1] - np.median(global_[-20:])) < 0.1 * ema[-1]  # rank 0's loss is 1.33x the global here


def test_nan_steps_are_marked_on_every_panel_that_has_them(tmp_path):
    fig = figure(tmp_path, sr.nan_steps(at=(160,)))
    p = panels(fig)
    for title, what in (("Loss", "loss"), ("Gradient norm", "grad norm")):
        mark = line(p[title], f"{what} NaN/inf")
        assert list(mark.get_xdata()) == [160] and to_rgb(mark.get_color()) == to_rgb(RED)
    for ax in p.values():  # the anomaly event: a red dashed line through every panel
        assert any(list(li.get_xdata()) == [160, 160] and li.get_linestyle() == "--" for li in ax.get_lines())
    assert "1 non-finite step(s)" in fig._suptitle.get_text() and "1 event(s)" in fig._suptitle.get_text()


def red_pixels(path):
    image = imread(path)[..., :3]
    return int(np.sum(np.all(np.abs(image - np.array(to_rgb(RED))) < 0.12, axis=-1)))


@pytest.mark.slow
def test_a_nan_is_visible_in_the_png_even_without_an_event(tmp_path):
    scenario = sr.clean()
    clean = plot_run(read_run(sr.write_run(tmp_path / "a", scenario)), str(tmp_path / "a.png"))
    scenario.ranks[0][LOSS][149] = math.nan  # no event written: only the value says it
    nan = plot_run(read_run(sr.write_run(tmp_path / "b", scenario)), str(tmp_path / "b.png"))
    assert red_pixels(clean) == 0
    assert red_pixels(nan) > 100


def test_findings_are_marked_where_they_are(tmp_path):
    p = panels(figure(tmp_path, sr.loss_spike(at=(150, 220))))
    assert list(line(p["Loss"], "loss spike").get_xdata()) == [150, 220]
    p = panels(figure(tmp_path, sr.periodic_grad_spikes(period=25)))
    assert "periodic spikes (every 25 steps)" in labels(p["Gradient norm"])
    p = panels(figure(tmp_path, sr.lr_too_high()))
    assert "grad norm rising (lr too high?)" in labels(p["Gradient norm"])


def test_missing_metric_is_said_on_its_panel(tmp_path):
    ax = panels(figure(tmp_path, sr.without(sr.clean(), GRAD_NORM)))["Gradient norm"]
    assert [t.get_text() for t in ax.texts] == ["train/grad_norm not recorded"]


def test_cli_default_output_and_cut_line_note(tmp_path, capsys):
    run_dir = sr.write_run(tmp_path / "run", sr.clean())
    sr.cut_last_line(run_dir)
    assert main(["plot", run_dir]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["[msbridge] note: rank_0.jsonl: the last line was cut (killed run?); "
                   "used the 299 complete metrics lines before it", f"{run_dir}/plot.png"]
    assert imread(f"{run_dir}/plot.png").shape[1] == 1320  # 12 in at 110 dpi
    fig = draw(read_run(run_dir))
    assert "the last line was cut" in footer(fig) and "steps 1-299" in fig._suptitle.get_text()


def test_cli_output_option(tmp_path, capsys):
    run_dir = sr.write_run(tmp_path / "run", sr.clean())
    assert main(["plot", run_dir, "-o", str(tmp_path / "x.png")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "x.png")
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_error_says_how_to_install(tmp_path, monkeypatch, capsys):
    run_dir = sr.write_run(tmp_path / "run", sr.clean())
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(MsbridgeError, match=r"pip install 'msbridge\[plot\]'"):
        draw(read_run(run_dir))
    assert main(["plot", run_dir]) == 2
    assert "pip install 'msbridge[plot]'" in capsys.readouterr().err


def test_bad_input_exits_2_with_the_reason(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "metrics/rank_*.jsonl is missing" in capsys.readouterr().err
    assert main(["plot", sr.write_header_only(str(tmp_path / "new"), schema_version=2)]) == 2
    assert "schema version 2" in capsys.readouterr().err
    assert main(["plot", sr.write_header_only(str(tmp_path / "empty"))]) == 2
    assert "nothing to plot, no metrics lines yet" in capsys.readouterr().err


@pytest.mark.slow
def test_real_run_plot(tmp_path, capsys):
    run_dir = sr.train_real_run(str(tmp_path / "real"), steps=120)
    assert main(["plot", run_dir]) == 0
    assert capsys.readouterr().out.strip() == f"{run_dir}/plot.png"
    p = panels(draw(read_run(run_dir)))
    assert p["Loss"].get_yscale() == "log"  # the regression loss falls by more than a decade
    assert len(line(p["Gradient norm"], "grad norm").get_xdata()) == 120


def test_per_layer_panel_shows_the_largest_layers_and_circles_the_first_to_spike(tmp_path):
    scenario = sr.with_layer_norms(sr.loss_spike(at=(150,), rank=0, world_size=1),
                                   spikes={"layers.2": [147, 148, 149, 150]})
    scenario.ranks[0]["grad_norm/tiny"] = np.full(len(scenario.steps), 1e-4)  # never among the top 6
    scenario.ranks[0]["grad_norm/tiny2"] = np.full(len(scenario.steps), 2e-4)
    fig = figure(tmp_path, scenario)
    p = panels(fig)
    assert list(p) == ["Loss", "Gradient norm", "Gradient norm per layer", "Learning rate", "Throughput"]
    ax = p["Gradient norm per layer"]
    assert ax.get_title() == "Gradient norm per layer (top 6 of 7 by median)"
    assert "tiny" not in labels(ax) and {"layers.0", "layers.2", "lm_head", "tiny2"} <= set(labels(ax))
    mark = line(ax, "first to spike: layers.2 (step 147)")
    assert mark.get_xdata().tolist() == [147] and to_rgb(mark.get_markeredgecolor()) == to_rgb(RED)
    assert ax.get_yscale() == "log"


def test_without_layer_norms_there_is_no_per_layer_panel(tmp_path):
    assert "Gradient norm per layer" not in panels(figure(tmp_path, sr.clean()))
