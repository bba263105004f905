"""Scalar events both hand encoders (TensorBoard's and MindSpore's field) must write as protobuf does."""
import math

SCALAR_EVENTS = [
    (0, 0.0, {"a": 0.0}),
    (1, 1_700_000_000.123, {"train/loss": 2.5, "perf/samples_per_s": 1e-40}),
    (2 ** 40, 1.5, {"dist/loss/rank_1": math.nan, "x": math.inf, "y": -math.inf, "big": 1e39, "neg": -3.5e38}),
    (7, 2.0, {"t" * 200: 1.0, "loss/ünï": -1.25}),  # tag lengths past one varint byte, UTF-8
]
