"""Runs bad-config corpus cases through ``load_config`` in this process, one after another, and measures each.

Run as a script (a fresh interpreter, so the peak RSS is the corpus's own):
``python config_corpus.py CASES_DIR``; each sub-directory of ``CASES_DIR`` is a case with a
``run.yaml`` (and ``sets.json``, the ``--set`` values). It prints one JSON line per case:
``{"name", "seconds", "peak_rss_mb", "outcome": "problems" | "accepted" | "timeout" | "traceback",
"problems": [...], "error"}``, ``seconds`` being the case's CPU time (user + system), which other load on
the machine does not stretch. The address space is capped (``AS_LIMIT``) so a runaway case fails
alone instead of taking the machine's memory; each case has ``LIMIT_S`` CPU seconds (SIGPROF) and, against
a case that hangs without computing, ``HANG_S`` wall seconds (SIGALRM).

Example:
    $ python tests/helpers/config_corpus.py /tmp/corpus
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
import traceback

LIMIT_S = 5.0  # CPU seconds
HANG_S = 60.0  # wall seconds: a case waiting on nothing still ends
AS_LIMIT = 3 << 30  # far above the 1 GB a case may use: only a runaway meets it


def _expire(signum, frame):
    what = f"{LIMIT_S} CPU s" if signum == signal.SIGPROF else f"{HANG_S} s"
    raise TimeoutError(f"still running after {what}")


def run_case(case_dir: str) -> dict:
    """One case: load it, say how it ended, its CPU time and the peak RSS after it."""
    from msbridge.config.load import load_config
    from msbridge.errors import ConfigError

    sets_file = os.path.join(case_dir, "sets.json")
    sets = json.load(open(sets_file)) if os.path.exists(sets_file) else []
    os.chdir(case_dir)
    result = {"name": os.path.basename(case_dir), "problems": [], "error": ""}
    start = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, LIMIT_S)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        load_config("run.yaml", overrides=sets)
        result["outcome"] = "accepted"
    except ConfigError as exc:
        result["outcome"], result["problems"] = "problems", exc.problems
    except TimeoutError:
        result["outcome"] = "timeout"
    except BaseException:  # the corpus must show no traceback: record it for the test to fail on
        result["outcome"], result["error"] = "traceback", traceback.format_exc()[-2000:]
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
    result["seconds"] = time.process_time() - start
    result["peak_rss_mb"] = peak_rss_mb()
    return result


def peak_rss_mb() -> float:
    """This process's peak RSS since it started its program: ``VmHWM``. ``ru_maxrss`` would not do: Linux
    carries the forking parent's peak across ``exec``, so a case run from a 1 GB pytest would read 1 GB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no /proc: an upper bound


def main(cases_dir: str) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    signal.signal(signal.SIGALRM, _expire)
    signal.signal(signal.SIGPROF, _expire)
    import msbridge.config.load  # noqa: F401  (imported before the first case is timed)

    for name in sorted(os.listdir(cases_dir)):
        print(json.dumps(run_case(os.path.join(cases_dir, name))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
