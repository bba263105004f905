"""Values a float would change, given to ``run.step`` / ``run.eval`` of a real run: a numpy or Python complex,
a complex Tensor, an integer past float64, a timedelta. Each is refused at that step with its keyword; the
steps around it are recorded as given and the run ends FINISHED (never an OverflowError at the next flush)."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

import msbridge
from msbridge.names import LOSS
from msbridge.sinks.runlog import read_run

HOSTILE = [
    ("loss", lambda: np.complex128(1.5 + 2j), TypeError, r"run.step\(loss=...\) takes a MindSpore Tensor or a real "
                                                          r"number, not complex128: not recorded"),
    ("acc", lambda: np.complex64(0.5 + 0.1j), TypeError, r"run.step\(acc=...\) .* not complex64"),
    ("loss", lambda: 1.5 + 2j, TypeError, r"run.step\(loss=...\) .* not complex: not recorded"),
    ("loss", lambda: ms.Tensor(np.array(1 + 2j, dtype=np.complex64)), TypeError,
     r"run.step\(loss=...\) takes a real Tensor, not Complex64"),
    ("tokens", lambda: 10 ** 400, ValueError, r"run.step\(tokens=...\) is an integer of about 401 digits, past the "
                                              r"largest float \(1.8e308\): not recorded"),
    ("tokens", lambda: -(10 ** 5000), ValueError, r"run.step\(tokens=...\) is an integer of about 5_00\d digits"),
    ("elapsed", lambda: np.timedelta64(3, "s"), TypeError, r"run.step\(elapsed=...\) .* not timedelta64"),
    ("loss", lambda: np.bool_(True), TypeError, r"run.step\(loss=...\) .* not bool"),
]


def _config(tmp_path):
    return {"experiment": "values", "run_name": "r", "output_dir": str(tmp_path / "{experiment}" / "{run_name}"),
            "flush_steps": 2, "sinks": ["jsonl"]}


@pytest.mark.parametrize("key,make,error,said", HOSTILE,
                         ids=["np-complex128", "np-complex64", "complex", "complex-tensor", "int-1e400",
                              "int-5000-digits", "timedelta", "np-bool"])
def test_a_value_a_float_would_change_is_refused_at_its_step(tmp_path, key, make, error, said):
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    with msbridge.track(_config(tmp_path), progress=False) as run:
        run.step(loss=2.0, tokens=10 ** 300, acc=0.5)
        with pytest.raises(error, match=said):
            run.step(**{"loss": 1.9, key: make()})
        run.step(loss=1.8, tokens=10 ** 300, acc=0.6)
        run.step(loss=1.7)
    assert run.outcome.status == "FINISHED"
    log = read_run(run.run_dir).ranks[0]
    assert log.series(LOSS) == [(1, 2.0), (2, 1.8), (3, 1.7)], "the refused step is not recorded; the others are"
    assert log.series("train/tokens") == [(1, 1e300), (2, 1e300)], "an integer a float holds is recorded"


def test_a_complex_eval_metric_is_refused_with_its_name(tmp_path):
    with msbridge.track(_config(tmp_path), progress=False) as run:
        run.step(loss=2.0)
        with pytest.raises(TypeError, match=r"run.eval\(accuracy=...\) .* not complex128"):
            run.eval(accuracy=np.complex128(0.9 + 0.1j))
        run.eval(accuracy=0.9)
    assert read_run(run.run_dir).ranks[0].series("eval/accuracy") == [(1, 0.9)]
