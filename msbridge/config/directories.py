"""Directory checks made before any training step: when a config is loaded, and when a run is planned.

An output directory is usually a template (``./runs/{experiment}/{run_name}``);
what can be checked before the run starts is its longest placeholder-free
prefix. ``writable_problem`` proves that prefix can be created and written,
without leaving anything behind: the one write check, which the loader runs
on the template's prefix and ``run.plan`` on the run dir once it is named. ``volatile_reason`` says when a
directory is under ``/tmp`` or on a tmpfs/ramfs mount, where it may be wiped.

Example:
    >>> static_prefix("/data/runs/{experiment}/{run_name}")
    '/data/runs'
    >>> writable_problem("/proc/msbridge-probe")  # doctest: +ELLIPSIS
    "cannot create '/proc/msbridge-probe': ..."
"""
from __future__ import annotations

import errno
import os
import string
import tempfile
from typing import Collection, Optional, Tuple

#: Directories whose contents may be removed on reboot or by tmp cleaners.
VOLATILE_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
#: Where the mount table is read from (tests point it at a fixture).
MOUNTS_FILE = "/proc/mounts"
_VOLATILE_FS = ("tmpfs", "ramfs")


def static_prefix(template: str) -> str:
    """The directory part of ``template`` before its first ``{placeholder}`` ("." if it starts with one)."""
    template = os.path.expanduser(template)
    cut = template.find("{")
    if cut < 0:
        return template
    head = template[:cut]
    return head[: head.rfind("/") + 1].rstrip("/") or ("/" if head.startswith("/") else ".")


def placeholder_problem(template: str, allowed: Collection[str]) -> Optional[str]:
    """Why ``template`` cannot be filled with the ``allowed`` placeholders, or None."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        return f"{template!r} is not a valid template: {exc}"
    bad = [name for name in names if name not in allowed]
    if bad:
        return f"unknown placeholder {{{bad[0]}}} in {template!r}; use {', '.join('{' + a + '}' for a in allowed)}"
    try:
        template.format(**{name: "x" for name in allowed})
    except (ValueError, KeyError, IndexError, AttributeError) as exc:
        return f"{template!r} is not a valid template: {exc}"
    return None


#: Linux's limits: bytes in one path component (NAME_MAX) and in a whole path (PATH_MAX, with its NUL).
NAME_MAX = 255
PATH_MAX = 4095


def path_problem(path: str) -> Optional[str]:
    """Why ``path`` can never be a directory here, or None: a NUL, a component over ``NAME_MAX`` bytes, a path
    over ``PATH_MAX``, a symlink loop, a dangling symlink or a file where a directory is needed on its way.

    Example:
        >>> path_problem("/data/" + "a" * 300 + "/run")  # doctest: +ELLIPSIS
        "a component of '/data/aaa...' is 300 bytes long; a file name holds at most 255 bytes"
    """
    if "\0" in path:
        return f"{path!r} holds a NUL character, which no file name may hold"
    path = os.path.abspath(os.path.expanduser(path))
    encoded = path.encode("utf-8", "surrogateescape")
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return (f"a component of {path[:60] + '...'!r} is {len(longest):,} bytes long; a file name holds at most "
                f"{NAME_MAX} bytes")
    if len(encoded) > PATH_MAX:
        return f"{path[:60] + '...'!r} is {len(encoded):,} bytes long; a path holds at most {PATH_MAX} bytes"
    probe, loop = path, None
    while True:
        try:
            os.stat(probe)
            if loop:
                return f"cannot create {path!r}: {loop!r} is a symlink loop"
            return None if os.path.isdir(probe) else f"cannot create {path!r}: {probe!r} is a file, not a directory"
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                loop = probe  # the loop is the deepest component whose parent resolves
            elif loop:
                return f"cannot create {path!r}: {loop!r} is a symlink loop"
            elif exc.errno == errno.ENOENT and os.path.islink(probe):
                return f"cannot create {path!r}: {probe!r} is a symlink to nothing ({os.readlink(probe)!r})"
            elif exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                return f"cannot reach {probe!r}: {exc.strerror or exc}"
        if probe == os.path.dirname(probe):
            return f"cannot create {path!r}: {loop!r} is a symlink loop" if loop else None
        probe = os.path.dirname(probe)


def writable_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be created and written, or None. Leaves nothing behind.

    An existing directory gets a probe file; for a missing one, a probe directory
    is made (and removed) in its deepest existing ancestor. Probe names are
    unique, so every rank of a job can check the same path at once.
    """
    shape = path_problem(path)
    if shape:
        return shape
    path = os.path.abspath(os.path.expanduser(path))
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"cannot create {path!r}: {probe!r} is a file, not a directory"
    try:
        if probe == path:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".msbridge-probe-"):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(dir=probe, prefix=".msbridge-probe-"))
    except OSError as exc:
        if probe == path:
            return f"cannot write to {path!r}: {exc.strerror or exc}"
        return f"cannot create {path!r}: no new directory can be made in {probe!r} ({exc.strerror or exc})"
    return None


def _mount_of(path: str) -> Optional[Tuple[str, str]]:
    """(mount point, fs type) of the mount holding ``path``, from the mount table."""
    try:
        with open(MOUNTS_FILE, encoding="utf-8") as fh:
            mounts = [line.split()[1:3] for line in fh if len(line.split()) >= 3]
    except OSError:
        return None
    best = None
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fstype)
    return best


def volatile_reason(path: str) -> Optional[str]:
    """Why files under ``path`` may vanish (``under /tmp`` / ``on tmpfs``), or None."""
    path = os.path.abspath(os.path.expanduser(path))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    real = os.path.normpath(os.path.join(os.path.realpath(existing), os.path.relpath(path, existing)))
    for root in VOLATILE_ROOTS:
        if real == root or real.startswith(root + "/"):
            return f"under {root}"
    mount = _mount_of(real)
    if mount and mount[1] in _VOLATILE_FS:
        return f"on {mount[1]} (mounted at {mount[0]})"
    return None
