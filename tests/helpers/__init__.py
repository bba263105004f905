"""What the tests share, imported as ``from helpers.NAME import ...`` (``tests/`` is on the path, pyproject's
``pythonpath``): builders of runs and records, real training, servers and launchers, and the scripts some tests
start in processes of their own (``dist_worker.py`` and ``track_worker.py`` under ``msrun``, ``sweep_job.py``).

Example:
    >>> from helpers.runs import make_run
"""
