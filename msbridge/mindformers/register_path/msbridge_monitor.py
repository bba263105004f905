"""mindformers ``auto_register`` entry point for ``MSBridgeMonitor``.

mindformers copies this file into its modules cache and imports it; the import
registers the one ``msbridge.mindformers.MSBridgeMonitor`` (a second registration
of the same class is a no-op).
"""
from msbridge.mindformers import MSBridgeMonitor

__all__ = ["MSBridgeMonitor"]
