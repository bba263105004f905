"""What the callback reads of the training dataset at train begin: the batch size, and the drop_remainder
warning, said only when an epoch's last batch really is short (or its size cannot be known)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import mindspore.dataset as ds
import numpy as np

from msbridge.capture.cb_params import batch_size_of, short_last_batch


def rows(n: int) -> ds.Dataset:
    return ds.NumpySlicesDataset({"x": np.zeros((n, 4), np.float32)}, shuffle=False)


def said(caplog, dataset) -> list:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        assert batch_size_of(SimpleNamespace(train_dataset=dataset)) == 8
    return [r.getMessage() for r in caplog.records if "drop_remainder" in r.getMessage()]


def test_no_warning_when_the_samples_divide_evenly(caplog):
    assert short_last_batch(rows(64).batch(8), 8) == 0
    assert said(caplog, rows(64).batch(8)) == []
    assert said(caplog, rows(60).batch(8, drop_remainder=True)) == []  # the short batch is dropped


def test_a_short_last_batch_is_said_with_its_size(caplog):
    pipeline = rows(60).batch(8).map(lambda x: x, input_columns=["x"])  # the batch below a map
    assert short_last_batch(pipeline, 8) == 4
    (message,) = said(caplog, pipeline)
    assert "an epoch's last batch holds 4 samples, not 8" in message


class Unsized:
    """A batch whose source cannot say how many samples it has."""

    drop_remainder = False

    def __init__(self) -> None:
        self.children = [SimpleNamespace(get_dataset_size=lambda: (_ for _ in ()).throw(RuntimeError("no size")))]

    def get_batch_size(self) -> int:
        return 8


def test_an_unknown_sample_count_is_said_as_may_be_short(caplog):
    assert short_last_batch(Unsized(), 8) is None
    (message,) = said(caplog, Unsized())
    assert "may hold fewer than 8 samples" in message
