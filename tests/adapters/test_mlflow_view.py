"""The saved view msbridge's MLflow runs open on: the train section's loss first, the perf section's first row
MFU, tokens seen and the loss over tokens seen.

Checked by hand in MLflow 3.17.2's UI (headless Chromium, this VM, 2026-12-04): the perf section's first row
shows these three, and MLflow files a chart it generates (``perf/data_wait_ms``) by name among a section's
cards unless the section is ``isReordered``, where it appends it (its bundle's chart reconciling code).
"""
from __future__ import annotations

import json

from msbridge.adapters._mlflow_view import LOSS_OVER_TOKENS, VIEW_SECTIONS, loss_first_view
from msbridge.names import DATA_WAIT_PCT, LOSS, MFU, SAMPLES_PER_S, TFLOPS, TOKENS_SEEN


def state():
    key, value = loss_first_view("e36a30f1d658")
    assert key == "mlflow.sharedViewState.msbridge-e36a30f1d658"
    return json.loads(value)


def test_the_perf_section_opens_on_mfu_tokens_seen_and_the_loss_over_tokens():
    charts = state()["compareRunCharts"]
    perf = [c for c in charts if c["metricSectionId"] == "msbridge-perf"]
    assert [c["metricKey"] for c in perf] == [MFU, TOKENS_SEEN, LOSS, SAMPLES_PER_S, TFLOPS, DATA_WAIT_PCT]
    over_tokens = perf[2]
    assert over_tokens["uuid"] == LOSS_OVER_TOKENS and over_tokens["xAxisKey"] == "metric"
    assert over_tokens["selectedXAxisMetricKey"] == TOKENS_SEEN and over_tokens["useGlobalXaxisKey"] is False
    assert all(c["xAxisKey"] == "step" and c["useGlobalXaxisKey"] for c in charts if c is not over_tokens)
    assert len({c["uuid"] for c in charts}) == len(charts), "every card its own uuid"


def test_the_sections_with_chosen_cards_keep_their_order():
    sections = state()["compareRunSections"]
    assert [s["name"] for s in sections] == ["train", *(n for n in VIEW_SECTIONS if n != "train")]
    assert {s["name"] for s in sections if s["isReordered"]} == {"train", "perf"}
