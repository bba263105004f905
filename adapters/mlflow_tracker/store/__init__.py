"""The local sqlite MLflow store: never changed when it is the user's, made from a template when new, and
written by sqlite itself on the fast path (one interface: ``native.NativeStore``).
"""
