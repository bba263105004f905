"""The MLflow tracker in layers, beside its sink (``adapters/mlflow_sink.py``: the run's lifecycle and delivery).

- ``run/``: what a run holds in MLflow (names, params, tags, events, LoggedModels, sweep parents, saved views);
  its names are public: ``msbridge.cli`` and ``msbridge.offline`` read them;
- ``client/``: MLflow's client in a child process, and how that process is scheduled;
- ``store/``: the local sqlite store: a user's store is theirs (``local``), a new one is made from a template
  (``template``), and a run's calls go to sqlite itself (``native``, ``rows``) where MLflow's client is not needed.
"""
