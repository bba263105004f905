"""How the TensorBoard sink's events reach disk: an event file of its own, or another library's writer.

``EventFile`` writes synchronously (``flush`` is a real barrier: file flush and
fsync); on a full disk its events wait in the sink's ``DiskWait`` and go into a fresh
event file next to the old one when space returns (``_diskwait``); ``SharedFile`` writes through a tensorboardX ``SummaryWriter`` that
another library (mindformers) already holds for the rank's directory.

Example:
    >>> events = EventFile(import_tensorboardx(), "/tmp/tb/run-1/rank_0", DiskWait("tensorboard"))
    >>> events.scalars(1, time.time(), {"train/loss": 2.3})
    >>> events.flush()
"""
from __future__ import annotations

import os
import socket
import time
from types import SimpleNamespace
from typing import Any, Dict, Mapping

from msbridge.adapters._diskwait import META, DiskWait, WaitingFile
from msbridge.adapters._eventwire import TENSORBOARD_VALUE, scalar_event, summary_event, version_event
from msbridge.errors import MissingDependencyError


def import_tensorboardx() -> SimpleNamespace:
    """tensorboardX's summary builders and protos (an install hint when it is missing)."""
    try:
        from tensorboardX import summary
        from tensorboardX.proto import event_pb2, summary_pb2
        from tensorboardX.proto.api_pb2 import Status
        from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
    except ImportError:
        raise MissingDependencyError("sink 'tensorboard'", "tensorboardX", "tensorboard") from None
    return SimpleNamespace(summary=summary, Event=event_pb2.Event,
                           Summary=summary_pb2.Summary, Status=Status, HParamsPluginData=HParamsPluginData)


class EventFile:
    """One event file in one directory, written synchronously (``flush`` is a real barrier)."""

    def __init__(self, tbx: SimpleNamespace, path: str, wait: DiskWait) -> None:
        self.path = path
        self.tags: Dict[str, str] = {}  # tag -> the metric name written under it
        self._tbx = tbx
        self._prefixes: Dict[str, bytes] = {}
        # the directory is made at the first write, which waits on a full disk
        self._file = WaitingFile(wait, path, self._new_name, version_event(time.time(), "brain.Event:2"))

    def _new_name(self) -> str:
        """tensorboardX's file name (by the second) plus the nanoseconds, so a reopen (a resume, or a fresh file
        after a full disk) within the same second neither truncates the earlier file nor sorts before it."""
        now = time.time_ns()
        return os.path.join(self.path, f"events.out.tfevents.{now // 10**9}.{socket.gethostname()}.{now % 10**9:09d}")

    def scalars(self, step: int, wall_time: float, values: Mapping[str, float]) -> None:
        self._file.write(scalar_event(step, wall_time, values, TENSORBOARD_VALUE, self._prefixes), step)

    def summary(self, summary: Any, step: int, wall_time: float, kind: str = META) -> None:
        data = self._tbx.Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()
        self._file.write(data, step, kind)

    def encoded(self, summary: bytes, step: int, wall_time: float, kind: str = META) -> None:
        """A ``Summary`` already encoded (``_eventwire``)."""
        self._file.write(summary_event(step, wall_time, summary), step, kind)

    def text(self, tag: str, text: str, step: int, kind: str = META) -> None:
        summary = self._tbx.summary.text(tag, text)
        summary.value[0].tag = tag  # tensorboardX appends "/text_summary"
        self.summary(summary, step, time.time(), kind)

    def flush(self) -> None:
        self._file.flush()  # file flush + fsync

    def close(self) -> None:
        self._file.close()


class SharedFile(EventFile):
    """Another library's tensorboardX ``SummaryWriter`` (mindformers'), written through instead of a file
    of our own: one event file per directory. Its queue thread writes; ``flush`` hands over, and the
    owner closes it."""

    def __init__(self, tbx: SimpleNamespace, writer: Any) -> None:  # pylint: disable=super-init-not-called
        self.path = writer.logdir
        self.tags = {}
        self._tbx = tbx
        self._writer = writer

    def scalars(self, step: int, wall_time: float, values: Mapping[str, float]) -> None:
        summary = self._tbx.Summary(value=[self._tbx.Summary.Value(tag=t, simple_value=v) for t, v in values.items()])
        self.summary(summary, step, wall_time)

    def summary(self, summary: Any, step: int, wall_time: float, kind: str = META) -> None:
        self._writer._get_file_writer().add_summary(summary, step, wall_time)

    def encoded(self, summary: bytes, step: int, wall_time: float, kind: str = META) -> None:
        self.summary(self._tbx.Summary.FromString(summary), step, wall_time)

    def flush(self) -> None:
        # its own file only: ``SummaryWriter.flush`` iterates the writers ``add_scalars`` adds, which the owner
        # may add to meanwhile (mindformers' per-head attention logits): "dictionary changed size"
        own = self._writer.file_writer  # None once the owner closed it
        if own is not None:
            own.flush()

    def close(self) -> None:
        self.flush()
