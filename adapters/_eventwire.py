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
pure-Python CRC32C takes ~60 us); ``_diskwait`` holds the files, and what a full disk keeps out of them.
"""
from __future__ import annotations

import logging
import math
import struct
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple

log = logging.getLogger("msbridge")

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


def histogram_summary(tag: str, detail: Mapping[str, Any], mindspore: bool = False) -> bytes:
    """The ``Summary`` of one histogram (a ``histogram`` event's detail: min, max, num, sum, sum_squares,
    bucket_limits, counts).

    TensorBoard: ``Value.histo`` (5), a ``HistogramProto`` (min = 1, max = 2, num = 3, sum = 4,
    sum_squares = 5 as doubles; bucket_limit = 6 and bucket = 7 packed doubles; bucket i spans
    (limit i-1, limit i], the first from min). MindSpore (``mindspore``): ``Value.histogram`` (9),
    a ``Histogram`` (buckets = 1, each left = 1 and width = 2 doubles and count = 3; max = 5,
    min = 6, sum = 7 doubles; count = 8); MindInsight shows it as ``<tag>/histogram``.
    """
    low, high, limits, counts = float(detail["min"]), float(detail["max"]), detail["bucket_limits"], detail["counts"]
    if mindspore:
        body = b""  # equal-width buckets: the first's left edge is one width below its limit
        left = 2 * float(limits[0]) - float(limits[1]) if len(limits) > 1 else low
        for limit, count in zip(limits, counts):
            bucket = b"\x09" + struct.pack("<d", left) + b"\x11" + struct.pack("<d", float(limit) - left) \
                + b"\x18" + varint(int(count))
            body, left = body + _field(1, bucket), float(limit)
        body += b"\x29" + struct.pack("<d", high) + b"\x31" + struct.pack("<d", low) \
            + b"\x39" + struct.pack("<d", float(detail["sum"])) + b"\x40" + varint(int(detail["num"]))
        return _field(1, _field(1, tag.encode()) + _field(9, body))
    body = b"".join(bytes([n << 3 | 1]) + struct.pack("<d", float(detail[k])) for n, k in
                    ((1, "min"), (2, "max"), (3, "num"), (4, "sum"), (5, "sum_squares")))
    if limits:
        body += _field(6, struct.pack(f"<{len(limits)}d", *limits)) \
            + _field(7, struct.pack(f"<{len(counts)}d", *counts))
    return _field(1, _field(1, tag.encode()) + _field(5, body))


def summary_event(step: int, wall_time: float, summary: bytes) -> bytes:
    """An ``Event`` around an encoded ``Summary`` (step 0 left out, as protobuf leaves a default)."""
    return b"\x09" + struct.pack("<d", wall_time) + (b"\x10" + varint(step) if step else b"") + _field(5, summary)


def version_event(wall_time: float, version: str) -> bytes:
    """The ``Event`` that opens an event file: its wall time and ``file_version``."""
    raw = version.encode()
    return b"\x09" + struct.pack("<d", wall_time) + b"\x1a" + varint(len(raw)) + raw


def read_records(path: str) -> Iterator[bytes]:
    """The event bodies of a TFRecord-framed file (u64 length, u32 CRC, body, u32 CRC), CRCs not checked."""
    with open(path, "rb") as fh:
        data = fh.read()
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        if pos + 12 + length > len(data):  # cut by a killed writer
            return
        yield data[pos + 12:pos + 12 + length]
        pos += 16 + length


def _varint_at(data: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("a varint cut short")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> Iterator[Tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of a protobuf message: an int for a varint, bytes for a
    length-delimited field, None for a fixed-width one; ``ValueError`` on a message cut short."""
    pos = 0
    while pos < len(data):
        key, pos = _varint_at(data, pos)
        wire, value = key & 7, None
        if wire == 0:
            value, pos = _varint_at(data, pos)
        elif wire == 2:
            size, pos = _varint_at(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
        if pos > len(data):
            raise ValueError("a field cut short")
        yield key >> 3, wire, value


def _summary_value(data: bytes) -> Tuple[str, bool, Optional[bytes]]:
    """A ``Summary.Value``: its tag, whether it holds a scalar (a float32 in field 2 or 3), a text's string."""
    tag, scalar, text = "", False, None
    for field, wire, value in _fields(data):
        if field == 1 and wire == 2:
            tag = value.decode("utf-8", "replace")
        elif field in (TENSORBOARD_VALUE, MINDSPORE_VALUE) and wire == 5:
            scalar = True
        elif field == 8 and wire == 2:  # a TensorProto; a text is its first string_val (field 8)
            text = next((v for f, w, v in _fields(value) if f == 8 and w == 2), None)
    return tag, scalar, text


def held_values(paths: Iterable[str]) -> Iterator[Tuple[int, str, bool, Optional[bytes]]]:
    """``(step, tag, is a scalar, text or None)`` of each event in event files written before: what a sink
    already holds. Only an event's first summary value is read (~0.01 ms an event): the sinks write one
    directory's scalars of one step per event, and one value per text or event marker. An event cut by a
    killed writer is left out."""
    for path in paths:
        for body in read_records(path):
            step, first = 0, None
            try:
                for field, wire, value in _fields(body):
                    if field == 2 and wire == 0:
                        step = value - (1 << 64) if value >> 63 else value
                    elif field == 5 and wire == 2:
                        first = next((v for f, w, v in _fields(value) if f == 1 and w == 2), None)
                if first is not None:
                    yield (step,) + _summary_value(first)
            except ValueError:
                continue
