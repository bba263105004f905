"""Measure what monitoring costs on the demo transformer (CPU): the same code as ``msbridge bench``.

    python examples/bench/run_bench.py                        # 300 steps x 3 repeats, ./bench_results
    python examples/bench/run_bench.py --setups a,e,f,g --repeats 5
    python examples/bench/run_bench.py --long-steps 100000    # also RSS over a long run, every sink on

Each setup runs in a fresh process, interleaved with the others; the table is
printed and written to ``--out`` as bench.md and bench.json.
"""
import os
import sys

os.environ.setdefault("GLOG_v", "3")

from msbridge.bench.suite import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
