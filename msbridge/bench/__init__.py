"""The lab: what monitoring costs, measured (``msbridge bench``), and the local servers the bench and the tests start.

- ``suite``: ``msbridge bench``, every setup interleaved against no monitoring; ``worker`` runs one setup in a
  fresh process, ``probes`` reads its CPU and RSS, ``costs`` the fixed costs per run; ``peers`` are what a team
  writes by hand instead (MLflow, tensorboardX, SummaryCollector, MFLossMonitor), ``hookclock`` times each setup's
  hooks and threads, ``sidebyside`` sets msbridge's CPU a step beside theirs and its budget;
- ``long``: a long synthetic run, then replay, plot, diagnose and compare timed on it;
- ``scale``: rank 0's per-flush code fed the table of N virtual ranks;
- ``blocked_open``: the step rate beside a sink whose ``open`` never returns, interleaved against none;
- ``servers``: a throwaway PostgreSQL cluster and an ``mlflow server`` on 127.0.0.1.

Nothing of the monitor imports this package; ``msbridge bench`` imports it when it runs.

Example:
    $ msbridge bench --steps 300 --repeats 3 --out ./bench_results
    $ python -m msbridge.bench.long --steps 500000 --out /tmp/msbridge-long
    $ python -m msbridge.bench.scale --ranks 8 128 1024 4096 16384
    $ python -m msbridge.bench.blocked_open --repeats 6 --steps 3000
"""
