"""Builders shared by the tests (import as ``from helpers.runs import make_run``; ``tests/`` is on the path)."""
