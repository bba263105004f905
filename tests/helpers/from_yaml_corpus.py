"""Builds ``BridgeMonitor.from_yaml`` on each case of a config corpus, as a training script would, and says how
it ended: the half of "config check accepts nothing that from_yaml then refuses" that ``config check`` is not.

Run as a script: ``python from_yaml_corpus.py CASES_DIR``; each sub-directory of ``CASES_DIR`` holds a
``run.yaml``. One JSON line per case: ``{"name", "outcome": "accepted" | "refused" | "timeout" | "traceback",
"error"}``. "refused" is a ``ConfigError`` (a clear problem); anything else raised is a traceback. An accepted
monitor lets go of what it built (its sinks, its rank file) before the next case. Each case has ``LIMIT_S`` CPU
seconds and ``HANG_S`` wall seconds.

Example:
    $ python tests/helpers/from_yaml_corpus.py /tmp/corpus
"""
from __future__ import annotations

import json
import os
import signal
import sys
import traceback

LIMIT_S = 10.0  # CPU seconds
HANG_S = 60.0  # wall seconds


def _expire(signum, frame):
    raise TimeoutError(f"still running after {LIMIT_S if signum == signal.SIGPROF else HANG_S} s")


def run_case(case_dir: str) -> dict:
    """One case: build the monitor from its run.yaml, then let go of it."""
    from msbridge.callback import BridgeMonitor
    from msbridge.errors import ConfigError
    from msbridge.run.ranks import release_rank_file

    os.chdir(case_dir)
    result = {"name": os.path.basename(case_dir), "error": ""}
    signal.setitimer(signal.ITIMER_PROF, LIMIT_S)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        monitor = BridgeMonitor.from_yaml("run.yaml", progress=False)
        result["outcome"] = "accepted"
        if monitor.plan is not None:
            monitor.plan.discard()
            release_rank_file(monitor.plan.run_dir, monitor.plan.ranks.rank)
    except ConfigError as exc:
        result["outcome"], result["error"] = "refused", "\n".join(exc.problems)[:2000]
    except TimeoutError:
        result["outcome"] = "timeout"
    except BaseException:  # the corpus must show no traceback: recorded for the test to fail on
        result["outcome"], result["error"] = "traceback", traceback.format_exc()[-2000:]
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
    return result


def main(cases_dir: str) -> None:
    signal.signal(signal.SIGALRM, _expire)
    signal.signal(signal.SIGPROF, _expire)
    for name in sorted(os.listdir(cases_dir)):
        print(json.dumps(run_case(os.path.join(cases_dir, name))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
