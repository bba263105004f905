"""``layer_norms`` / ``layer_norms_group`` applied to parameter names: who is matched, how layers fold."""
from __future__ import annotations

import math

import numpy as np
import pytest

from msbridge.capture.param_select import ParamSelector

NAMES = ["model.tok_embeddings.embedding_weight", "model.layers.0.attention.wq.weight",
         "model.layers.0.feed_forward.w1.weight", "model.layers.1.attention.wq.weight", "model.norm_out.weight",
         "lm_head.weight"]


def test_layers_fold_and_the_rest_keep_their_names():
    sel = ParamSelector(r"layers|lm_head", r"(model\.layers\.\d+)\.").select(NAMES)
    assert sel.indices == (1, 2, 3, 5)
    assert sel.labels == ("model.layers.0", "model.layers.1", "lm_head.weight")
    norms = np.array([[9.0, 3.0, 4.0, 2.0, 9.0, 1.0], [9.0, math.nan, 4.0, 2.0, 9.0, 1.0]])
    np.testing.assert_allclose(sel.reduce(norms), [[5.0, 2.0, 1.0], [math.nan, 2.0, 1.0]])  # NaN stays in its layer
    assert list(sel.named(lambda p: f"grad_norm/{p}", norms)) == \
        ["grad_norm/model.layers.0", "grad_norm/model.layers.1", "grad_norm/lm_head.weight"]


def test_without_a_group_every_match_is_its_own_series():
    sel = ParamSelector("attention").select(NAMES)
    assert sel.labels == ("model.layers.0.attention.wq.weight", "model.layers.1.attention.wq.weight")
    assert not sel.grouped
    np.testing.assert_allclose(sel.reduce(np.array([3.0, 4.0]), picked=True), [3.0, 4.0])


def test_group_must_have_one_capturing_group():
    with pytest.raises(ValueError, match="exactly one capturing group"):
        ParamSelector(".*", r"layers\.\d+")
