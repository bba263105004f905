"""Scalar events encoded by hand, and the record files they go into: shared by the TensorBoard and
MindInsight sinks.

TensorBoard's ``Event`` and MindSpore's summary ``Event`` lay scalars out alike on the wire:
Event.wall_time = 1 (double), Event.step = 2 (varint), Event.file_version = 3 (string),
Event.summary = 5; Summary.value = 1; Value.tag = 1; the value is a float32 in field 2
(TensorBoard's ``simple_value``) or 3 (MindSpore's ``scalar_value``). Encoding here takes
~0.01 ms a record; the generated classes run on protobuf's pure-Python backend under MindSpore
(~0.2-0.5 ms a record).

TensorBoard's Custom Scalars layout (``custom_scalars_summary``) is encoded here too, as
tensorboardX's ``summary.custom_scalars`` serialises it: a ``Summary`` whose one value, tagged
``custom_scalars__config__`` for the plugin ``custom_scalars``, is a string tensor holding the
``Layout`` message (Layout.category = 2; Category.title = 1, chart = 2, closed = 3; Chart.title = 1,
multiline = 2; MultilineChartContent.tag = 1, each a regex of tags).

Both formats frame each event as a TFRecord (length, masked CRC32C, body, masked CRC32C).
MindSpore's C++ ``EventWriter_`` does that framing (~2 us a record; tensorboardX's
pure-Python CRC32C takes ~60 us).
"""
from __future__ import annotations

import math
import os
import struct
from typing import Dict, Iterator, Mapping, Sequence, Tuple

#: The field number of a scalar's float32 value in ``Summary.Value``.
TENSORBOARD_VALUE = 2
MINDSPORE_VALUE = 3
#: A custom-scalars layout: ``[(category title, closed, [(chart title, [tag regex, ...]), ...]), ...]``.
Layout = Sequence[Tuple[str, bool, Sequence[Tuple[str, Sequence[str]]]]]
_DT_STRING = 7  # TensorProto.dtype of a string tensor


def varint(n: int) -> bytes:
    """``n`` as a protobuf varint; a negative int64 as protobuf puts it on the wire (10 bytes)."""
    n &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def float32(value: float) -> bytes:
    """``value`` as a little-endian float32; beyond float32's range it is +-inf, as protobuf stores it."""
    try:
        return struct.pack("<f", value)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, value))


def scalar_event(step: int, wall_time: float, values: Mapping[str, float], value_field: int,
                 prefixes: Dict[str, bytes]) -> bytes:
    """An ``Event`` of scalars ``{tag: value}``, serialised byte for byte as protobuf's classes do.

    ``value_field``: ``TENSORBOARD_VALUE`` or ``MINDSPORE_VALUE``. ``prefixes`` caches each tag's
    bytes up to its value; keep one cache per ``value_field``.
    """
    body = bytearray()
    for tag, value in values.items():
        prefix = prefixes.get(tag)
        if prefix is None:
            raw = tag.encode()
            entry = b"\x0a" + varint(len(raw)) + raw + bytes([value_field << 3 | 5])
            prefix = prefixes[tag] = b"\x0a" + varint(len(entry) + 4) + entry
        body += prefix + float32(value)
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + varint(step) + b"\x2a" + varint(len(body)) + body


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a string, bytes or a message)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def custom_scalars_summary(layout: Layout) -> bytes:
    """The ``Summary`` that gives TensorBoard's Custom Scalars tab its ``layout``, byte for byte as
    tensorboardX's protobuf classes serialise it."""
    categories = b""
    for title, closed, charts in layout:
        body = _field(1, title.encode())
        for chart, tags in charts:
            lines = b"".join(_field(1, tag.encode()) for tag in tags)
            body += _field(2, _field(1, chart.encode()) + _field(2, lines))
        categories += _field(2, body + (b"\x18\x01" if closed else b""))
    tensor = varint(1 << 3) + varint(_DT_STRING) + _field(2, b"") + _field(8, categories)
    metadata = _field(1, _field(1, b"custom_scalars"))  # SummaryMetadata.plugin_data.plugin_name
    return _field(1, _field(1, b"custom_scalars__config__") + _field(8, tensor) + _field(9, metadata))


def summary_event(step: int, wall_time: float, summary: bytes) -> bytes:
    """An ``Event`` around an encoded ``Summary`` (step 0 left out, as protobuf leaves a default)."""
    return b"\x09" + struct.pack("<d", wall_time) + (b"\x10" + varint(step) if step else b"") + _field(5, summary)


def version_event(wall_time: float, version: str) -> bytes:
    """The ``Event`` that opens an event file: its wall time and ``file_version``."""
    raw = version.encode()
    return b"\x09" + struct.pack("<d", wall_time) + b"\x1a" + varint(len(raw)) + raw


def fsync(path: str) -> None:
    """fsync a file another writer (MindSpore's C++ one) holds open."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: str) -> Iterator[bytes]:
    """The event bodies of a TFRecord-framed file (u64 length, u32 CRC, body, u32 CRC), CRCs not checked."""
    with open(path, "rb") as fh:
        data = fh.read()
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        yield data[pos + 12:pos + 12 + length]
        pos += 16 + length


class RecordFile:
    """An event file of TFRecord-framed events, written through MindSpore's C++ ``EventWriter_``.

    ``write`` hands the record to the writer's buffer; ``flush`` makes everything written durable.

    Example:
        >>> f = RecordFile("/tmp/tb/events.out.tfevents.1.host")
        >>> f.write(version_event(time.time(), "brain.Event:2"))
        >>> f.flush(); f.close()
    """

    def __init__(self, path: str) -> None:
        from mindspore._c_expression import EventWriter_

        self.path = path
        self._writer = EventWriter_(path)

    def write(self, data: bytes) -> None:
        self._writer.Write(data)

    def flush(self) -> None:
        self._writer.Flush()
        fsync(self.path)

    def close(self) -> None:
        self.flush()
        self._writer.Shut()
