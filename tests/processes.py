"""Helpers for tests that start real servers and launchers: free ports, process groups.

They live in ``msbridge.cli.servers`` (``msbridge bench`` starts servers too); tests import them from here.
"""
from msbridge.cli.servers import free_port, group_alive, stop_group

__all__ = ["free_port", "group_alive", "stop_group"]
