"""One sink on a thread of its own: every call of it is a ``Call`` (``calls.py``), made there, bounded.

The host's thread ``msbridge-<name>`` takes calls from its queue in order: ``describe``, ``open`` and ``held``
(queued: nobody waits for the open), then ``write``/``flush``, and last ``close`` and ``undelivered``. ``offer``
queues a batch and never waits: a full queue means the sink is far behind (stalled, starved or unreachable). A
tracker then reads the write-ahead log with a cursor of its own, as Prometheus remote write tails its WAL: it takes
no more batches from memory, and once its queue is empty it reads the jsonl from where it stopped
(``runlog.read_from``), in chunks, each handed to ``write`` through its ``Handoff`` (``handoff.py``: it skips the
steps the sink holds or was handed already), then goes back to live batches once a read reached the end of the log
with no batch left out meanwhile. A tracker that declares ``batch_seconds`` (MLflow) takes its live batches at most
that often: those queued meanwhile go in one ``write`` (before a ``flush`` call or the close, or with its queue
half full, at once). No record waits in memory for a sink that is behind, and a sink is never left behind for the
rest of a run; at the close it reads what is left within its close bound, and what it still lacks is named with the
replay that fills it.
Without a write-ahead log (``wal``), a full queue leaves the sink behind for the run, as one tail counted in
``missed``. ``lossless`` (jsonl itself) makes ``offer`` wait instead, at most the sink's bound. ``ask`` waits for one
call, at most its bound.

Whatever goes wrong with a call (a raise, a wrong return type, a call still running when its bound ran out
while it was waited for) is a ``Failure``, kept in ``failures`` with the first one's text; the sink is then
undelivered in the run's outcome. A sink that failed to open, or hung, is handed nothing more. What a sink
returned of its own accord (``Gaps``) goes to ``on_gaps``. A call that returns after its bound with nobody
waiting (an ``open`` or a ``write`` starved of CPU) is said once as a warning: it kept no one waiting, and its
queue bound is what stops a sink that falls too far behind. The thread sleeps on a condition while idle.

``Driver`` drives one sink call by call on a host, waiting for each (``msbridge replay``, a refused run's
discard, ``check_sink``): the same thread, calls and bounds, its first failure raised as one line.

Example:
    >>> host = SinkHost(sink, max_batches=256)
    >>> host.open(run)                       # queued: returns at once
    >>> host.offer(records, events)          # True: queued; False: missed (the sink is behind)
    >>> host.close("FINISHED").done.wait(sink.close_bound)   # then its final undelivered()
"""
from __future__ import annotations

import collections
import logging
import math
import threading
import time
from typing import Any, Callable, Deque, List, Optional, Sequence, Set, Tuple, Type

from ..errors import MsbridgeError
from .base import CLOSE_GRACE, GAP, Behind, Event, Record, RunInfo, Sink
from .calls import Call, Failure, Gaps
from .handoff import Handoff
from .runlog import read_from

log = logging.getLogger("msbridge")

#: Lines of the write-ahead log a tracker that is behind reads and writes at a time.
CATCH_UP_LINES = 5000
#: Seconds between reads of the log while a read found it ends short of what was left out (lines jsonl holds).
CATCH_UP_RETRY = 0.5


class SinkHost:
    """Runs ``sink``'s calls on the daemon thread ``msbridge-<name>``.

    Args:
        wal: where the write-ahead log is now (jsonl's path), read when the sink falls behind; None: no log.

    Attributes:
        handoff: makes every call of the sink, each batch filtered (``Handoff``: held and handed steps, times).
        failures: every ``Failure`` of its calls, in order (the first one is what the outcome says).
        done_records / done_step: records, and the highest step, of the writes that returned.
        missed_records / missed_steps / missed_events, behind_from: what it was not handed (queue full, no log).
        caught_up: times it read the log back to live.
        closed: set once its close and its final ``undelivered()`` returned (or failed).
        said: the ``describe(run)`` asked again right after its close (what only the closed run knows, such as
            MLflow's address of the run or its sweep's view), once ``closed`` is set; None before a close.
        hung: a call it waited for overran: its thread is still held by it.

    Example:
        >>> host = SinkHost(TensorBoardSink(), on_gaps=lambda sink, gaps: None)
        >>> host.open(run); host.offer(make_records([1, 2]), [])
        True
    """

    def __init__(self, sink: Sink, max_batches: int = 256, lossless: bool = False,
                 on_gaps: Optional[Callable[[Sink, Gaps], None]] = None,
                 after_write: Optional[Callable[[Call], None]] = None, quiet: bool = False,
                 wal: Optional[Callable[[], str]] = None) -> None:
        self.sink, self.max_batches, self.lossless, self.quiet = sink, max_batches, lossless, quiet
        self.handoff = Handoff(sink)
        self._wal = wal
        self._cursor = _Cursor()
        self.caught_up = 0
        self.failures: List[Failure] = []
        self.done_records = self.done_step = 0
        self.missed_records = self.missed_steps = self.missed_events = 0
        self.behind_from: Optional[int] = None
        self.closed = threading.Event()
        self.opened = self.hung = False
        self._on_gaps, self._after_write = on_gaps, after_write
        self._items: Deque[Call] = collections.deque()
        self._writes = 0  # write calls in ``_items``: what the bound counts
        self._ready = threading.Condition()
        self._running: Optional[Call] = None
        # a tracker's batches of ``batch_seconds`` in one write (its option, base.BATCH_SECONDS); 0: each at once
        self._batch_s = float(getattr(sink, "settings", {}).get("batch_seconds", 0.0)) if wal is not None else 0.0
        self._last_write = -math.inf
        self._started_at = 0.0
        self._slow: Set[str] = set()  # the calls said to have returned after their bound
        self._dead = False  # failed to open, or a call hung: handed nothing more
        self._closing: Optional[Call] = None  # the last call, once ``close`` (or ``retire``) queued it
        self._run: Optional[RunInfo] = None
        self.said: Optional[Call] = None
        self._thread = threading.Thread(target=self._loop, name=f"msbridge-{sink.name}", daemon=True)
        self._thread.start()

    def open(self, run: RunInfo) -> None:
        """Queue ``open(run)``, ``held()`` and a first ``flush`` (first contact: MLflow makes its run at once);
        returns at once (writes queue behind them)."""
        self._run = run
        for call in (Call("open", run=run), Call("held"), Call("flush")):
            self.put(call)

    def close(self, status: str) -> Call:
        """Queue ``close(status)``, ``describe(run)`` again (``said``), then ``undelivered()``, the host's last call;
        ``closed`` is set once that returned (or failed). Returns the ``undelivered`` call: its result is the
        sink's final word."""
        with self._ready:
            if self._closing is None:
                self._closing = Call("undelivered")
                self.said = Call("describe", run=self._run) if self._run is not None else None
                self._items.extend(c for c in (Call("close", status=status), self.said, self._closing) if c)
                self._ready.notify_all()
            return self._closing

    def retire(self) -> None:
        """End the thread after what is queued, without closing the sink (a host made for one call)."""
        with self._ready:
            if self._closing is None:
                self._closing = Call("retire")
                self._items.append(self._closing)
                self._ready.notify_all()

    # -- any thread ----------------------------------------------------------------
    def offer(self, records: Sequence[Record], events: Sequence[Event], relayed_from: str = "") -> bool:
        """Queue a batch; never waits (``lossless``: waits while the queue is full, at most the sink's bound,
        once). ``relayed_from``: the sink whose gaps they are (see ``Call``)."""
        call = Call("write", records=list(records), events=list(events), relayed_from=relayed_from)
        with self._ready:
            if self._closing is not None:  # closed: what comes after its close is in ``gaps`` only
                return False
            if self.lossless and not self._dead and self.behind_from is None:
                self._ready.wait_for(lambda: self._writes < self.max_batches or self._dead, self.sink.close_bound)
            if self.behind_from is None and not self._dead and self._writes < self.max_batches:
                self._items.append(call)
                self._writes += 1
                self._ready.notify_all()
                return True
            if self._wal is not None and not self._dead:  # in the log: read from there once it keeps up
                first = self._cursor.left_out(records, events, self.done_step)
                if first:
                    self.behind_from = self._cursor.behind_from
                    self._ready.notify_all()
            else:
                first = self._miss(records, events)
        if first and not self._dead:
            log.warning("msbridge: sink %r is %d batches behind; from step %d it %s", self.sink.name,
                        self.max_batches, self.behind_from,
                        "reads the write-ahead log (jsonl) as soon as it keeps up" if self._wal is not None else
                        "gets nothing more in this run (the run's outcome names the replay that fills it)")
        return False

    def _miss(self, records: Sequence[Record], events: Sequence[Event]) -> bool:
        """Count a batch left out for good (no log to read it from); True for the first. The caller holds the lock."""
        first = self.behind_from is None
        if first:
            steps = [r.step for r in records] + [e.step for e in events]
            self.behind_from = min(steps) if steps else self.done_step + 1
        self.missed_records += len(records)
        self.missed_steps += len({r.step for r in records})
        self.missed_events += len(events)
        return first

    def put(self, call: Call) -> Call:
        """Queue ``call`` after everything queued (no bound: a flush, a close); returns it (wait on ``done``)."""
        with self._ready:
            if self._dead or self._closing is not None:
                call.done.set()
                return call
            self._items.append(call)
            self._ready.notify_all()
        return call

    def ask(self, call: Call, wait: Optional[float] = None) -> Any:
        """Queue ``call`` and wait for it, at most ``wait`` (default: its bound); its result, None when it failed
        or did not return in time (then a ``Failure``)."""
        self.put(call)
        limit = call.bound(self.sink) if wait is None else wait
        if not call.done.wait(limit):
            self.overran(call, limit)
            return None
        return call.result

    def overran(self, call: Call, waited: float) -> None:
        """``call`` was waited for ``waited`` s and has not returned: a Failure; the sink is handed nothing more."""
        running = self._running
        what = running.method if running is not None else call.method
        self._fail(Failure(what, f"did not return within {waited:g} s ({call.method} waited for it)"))
        with self._ready:
            self._dead = self.hung = True
            self._ready.notify_all()

    @property
    def missed(self) -> str:
        """What it was not handed, "" when nothing: "missed 40 records of 40 steps from step 61 and 2 events"; a sink
        still behind the log: "behind from step 61: it read the write-ahead log up to step 80 of 100"."""
        if self.behind_from is None:
            return ""
        if self._cursor.behind and not self._dead:
            return (f"behind from step {self.behind_from}: it read the write-ahead log up to step {self.done_step} "
                    f"of {self._cursor.until}")
        why = "its queue of %d batches was full" % self.max_batches if not self._dead else "a call of it failed"
        return (f"missed {self.missed_records} records of {self.missed_steps} steps from step {self.behind_from} "
                f"and {self.missed_events} events ({why})")

    def running_for(self) -> str:
        """The call running now and for how long ("write() running for 12 s"), "" when idle."""
        running = self._running
        return f"{running.method}() running for {time.monotonic() - self._started_at:.0f} s" if running else ""

    # -- the sink's thread ------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._items and not self._may_read():
                    self._ready.wait(self._cursor.wait())
                self._pace()
                call = self._items.popleft() if self._items else None
                if call is not None and call.method == "write":
                    self._merge(call)
            if call is None:
                self._read_log()
                continue
            if call.method == "write" and self._cursor.behind and not self._dead:  # in the log: read in order
                with self._ready:
                    self._cursor.left_out(call.records, call.events, self.done_step)
                call.done.set()
                continue
            if call.method in ("flush", "close") and self._cursor.behind and not self._dead:
                self._read_log(to_end=True)  # a close within its bound: what it lacks then is named
            if call.method == "write" and self._cursor.offset:  # read the log once: a batch may be in both
                call.records = [r for r in call.records if self._cursor.new_record(r, self.done_step)]
                call.events = [e for e in call.events if self._cursor.new_event(e, self.sink.name)]
                if not call.records and not call.events:  # all of it handed from the log already
                    call.done.set()
                    continue
            if call.method == "write":
                self._last_write = time.monotonic()
            if call is self.said:
                self._ask_again(call)
            elif not self._dead or call is self._closing:
                self._make(call)
            elif call.method == "write":  # failed to open, or hung: nothing more reaches it
                self._count_missed(call)
            call.done.set()
            if call is self._closing:
                self.closed.set()
                return

    def _pace(self) -> None:
        """A tracker's live batches at most once every ``batch_seconds``: while its queue holds only batches, under
        half its bound, and its last write is more recent, it waits (a ``flush`` call or the close goes at once).
        The caller holds the lock."""
        while (self._batch_s and self._items and self._closing is None and not self._dead
               and self._writes < self.max_batches // 2 and all(c.method == "write" for c in self._items)):
            left = self._last_write + self._batch_s - time.monotonic()
            if left <= 0:
                return
            self._ready.wait(left)

    def _merge(self, call: Call) -> None:
        """A tracker's ``call`` (a write, just taken from the queue) with the writes queued right behind it from the
        same source: their records and events join ``call``'s, and they are done. The caller holds the lock."""
        merged = [call]
        while (self._batch_s and self._items and self._items[0].method == "write"
               and self._items[0].relayed_from == call.relayed_from):
            merged.append(self._items.popleft())
            merged[-1].done.set()
        if len(merged) > 1:
            call.records = [r for c in merged for r in c.records]
            call.events = [e for c in merged for e in c.events]
        self._writes -= len(merged)
        self._ready.notify_all()

    def _ask_again(self, call: Call) -> None:
        """``describe`` after the close (``said``): what it returns, else nothing; never a failure of the sink's
        (what it delivered is settled by then)."""
        if self._dead:
            return
        try:
            call.result = call.check(call.invoke(self.sink))
        except Exception as exc:
            log.debug("msbridge: sink %r: describe() after its close: %s: %s", self.sink.name, type(exc).__name__, exc)

    def _may_read(self) -> bool:
        """Behind, able to read, not closing, and due for a read of the log. The caller holds the lock."""
        return (self._cursor.behind and not self._dead and self._closing is None
                and time.monotonic() >= self._cursor.next_read)

    def _read_log(self, to_end: bool = False) -> None:
        """Hand the sink the next lines of the write-ahead log from its cursor (``to_end``, for a flush or the close:
        every line left, a refused batch tried again every ``CATCH_UP_RETRY`` s for the sink's ``close_timeout``);
        back to live batches once a read found no line left and no batch was left out meanwhile."""
        cursor = self._cursor
        give_up = time.monotonic() + self.sink.close_bound - CLOSE_GRACE  # to_end: refused batches are tried till then
        while True:
            left, start = cursor.left, cursor.offset
            try:
                records, events, cursor.offset = read_from(self._wal(), cursor.offset, CATCH_UP_LINES)
            except OSError as exc:  # the log moved or is gone: tried again, named at the close if still behind
                cursor.next_read = time.monotonic() + CATCH_UP_RETRY
                log.debug("msbridge: sink %r cannot read the write-ahead log: %s", self.sink.name, exc)
                return
            records = [rec for rec in records if cursor.new_record(rec, self.done_step)]
            events = [ev for ev in events if cursor.new_event(ev, self.sink.name)]
            if records or events:
                call = Call("write", records=records, events=events)
                self._make(call)
                if call.refused:  # still behind: the same lines again, after a pause (to_end: until its bound)
                    cursor.offset = start
                    if to_end and not self._dead and time.monotonic() + CATCH_UP_RETRY < give_up:
                        time.sleep(CATCH_UP_RETRY)
                        continue
                    return
                if to_end and not self._dead:
                    continue
                return
            with self._ready:
                if cursor.left == left and self.done_step >= cursor.until:
                    cursor.behind, self.behind_from = False, None
                    self.caught_up += 1
                    log.info("msbridge: sink %r read the write-ahead log up to step %d: live again", self.sink.name,
                             self.done_step)
                else:  # a batch left out meanwhile, or lines jsonl still holds (a full disk): read again soon
                    cursor.next_read = time.monotonic() + CATCH_UP_RETRY
            return

    def _make(self, call: Call) -> None:
        self._running, self._started_at = call, time.monotonic()
        try:
            call.result = call.check(self.handoff.invoke(call))
        except Behind as exc:
            if self._wal is None or call.method != "write":
                call.failure = Failure(call.method, f"{type(exc).__name__}: {exc}")
            else:  # not taken: read from the log once it takes a batch again, not a failure
                self._refused(call, exc)
                return
        except Exception as exc:  # one broken sink never stops training or the others
            call.failure = Failure(call.method, f"{type(exc).__name__}: {exc}")
        finally:
            took, self._running = time.monotonic() - self._started_at, None
        if call.failure is None and took > call.bound(self.sink):
            self._say_slow(call, took)
        if call.failure is not None:
            self._fail(call.failure)
            if call.method in ("open", "held"):  # not open, or cannot say what it holds: nothing more
                self._dead = True
            return
        self.opened = self.opened or call.method == "open"
        if call.method == "write":
            self.done_records += len(call.records)
            if self._wal is not None:
                self._cursor.saw(call.records, call.events, self.done_step)
            self.done_step = max([self.done_step, *(r.step for r in call.records)])
            if self._after_write is not None:
                self._after_write(call)
        if isinstance(call.result, Gaps) and call.result.events and self._on_gaps is not None:
            self._on_gaps(self.sink, call.result)

    def _refused(self, call: Call, why: Behind) -> None:
        """The sink did not take ``call`` (``Behind``): it reads it from the log, after a pause."""
        call.refused = True
        with self._ready:
            first = self._cursor.left_out(call.records, call.events, self.done_step)
            self.behind_from = self._cursor.behind_from
            self._cursor.next_read = time.monotonic() + CATCH_UP_RETRY
        if first:
            log.warning("msbridge: sink %r is behind (%s); from step %d it reads the write-ahead log (jsonl) once it "
                        "takes a batch again", self.sink.name, why, self.behind_from)

    def _say_slow(self, call: Call, took: float) -> None:
        """A call that returned after its bound: nobody was kept waiting (a wait that ran out is a ``Failure``,
        ``overran``), and what it was handed is stored; said once per sink and call, as a warning."""
        if call.method in self._slow:
            return
        self._slow.add(call.method)
        log.warning("msbridge: sink %r: %s() took %.1f s, over its bound of %g s; it is behind (its queue holds "
                    "what comes meanwhile)", self.sink.name, call.method, took, call.bound(self.sink))

    def _count_missed(self, call: Call) -> None:
        with self._ready:
            self._miss(call.records, call.events)

    def _fail(self, failure: Failure) -> None:
        with self._ready:
            self.failures.append(failure)
            first = len(self.failures) == 1
        if first and not self.quiet:  # quiet: its driver says it
            log.error("msbridge: sink %r failed in %s; other sinks and training carry on", self.sink.name, failure)


def _event_key(ev: Event) -> Tuple[str, int, int, float]:
    return ev.kind, ev.step, ev.rank, ev.time


class _Cursor:
    """A tracker's place in the write-ahead log: whether it is behind (taking no batch from memory), from which
    step, the highest step of a batch left out (``until``), how many were (``left``), the byte ``offset`` it read
    up to, the metrics handed at the last step and the events handed (each line of the log is offered once)."""

    def __init__(self) -> None:
        self.behind = False
        self.behind_from = 0
        self.until = self.left = self.offset = 0
        self.next_read = 0.0
        self.names: Set[str] = set()  # the metrics handed at the highest step handed
        self.handed: Set[Tuple[str, int, int, float]] = set()

    def left_out(self, records: Sequence[Record], events: Sequence[Event], done_step: int) -> bool:
        """A batch not taken (it is in the log); True for the first since the sink was last live."""
        steps = [r.step for r in records] + [e.step for e in events]
        first = not self.behind
        if first:
            self.behind, self.behind_from = True, min(steps, default=done_step + 1)
        self.left += 1
        self.until = max([self.until, *steps])
        return first

    def saw(self, records: Sequence[Record], events: Sequence[Event], done_step: int) -> None:
        """A write handed ``records`` and ``events``; ``done_step`` is the highest step handed before it."""
        for rec in records:
            if rec.step > done_step:
                done_step, self.names = rec.step, set(rec.values)
            elif rec.step == done_step:
                self.names.update(rec.values)
        self.handed.update(map(_event_key, events))

    def new_record(self, rec: Record, done_step: int) -> bool:
        """Whether ``rec``, read from the log, is still to be handed: a later step, or the last step handed with a
        metric it was not handed at that step (an evaluation's record after the training's)."""
        return rec.step > done_step or (rec.step == done_step and not self.names.issuperset(rec.values))

    def new_event(self, ev: Event, sink: str) -> bool:
        """Whether ``ev``, read from the log, is still to be handed: not handed already, nor this sink's own gap."""
        return _event_key(ev) not in self.handed and not (ev.kind == GAP and ev.detail.get("sink") == sink)

    def wait(self) -> Optional[float]:
        """Seconds to sleep before the next read while behind; None (until notified) when not behind."""
        return max(0.01, self.next_read - time.monotonic()) if self.behind else None


class SinkFailed(MsbridgeError):
    """A call that a ``Driver`` waited for failed: the message is its ``Failure``, "write(): OSError: ..."."""


class Driver:
    """One sink driven call by call on its ``SinkHost`` (quiet: the driver says its failures), as ``msbridge
    replay``, a refused run's discard and ``check_sink`` drive it: each call is waited for at most its bound
    (``Call.bound``: ``describe`` 2 s, ``close`` its close bound ...) or ``limit`` s, whichever is less, and the
    first failure (a raise, a wrong type, an overrun) raises ``error`` with its text.

    Example:
        >>> sink = Driver(TensorBoardSink(logdir="/tmp/tb"))
        >>> sink.open(run); sink.write(records, []); sink.close("FINISHED")   # its final undelivered()
        ''
    """

    error: Type[Exception] = SinkFailed

    def __init__(self, sink: Sink, limit: float = math.inf, max_batches: int = 4) -> None:
        self.sink, self.limit = sink, limit
        self.host = SinkHost(sink, max_batches, lossless=True, quiet=True)

    def wait(self, call: Call) -> float:
        """Seconds ``call`` is waited for: its bound, at most ``limit``."""
        return min(self.limit, call.bound(self.sink))

    def ask(self, call: Call, host: Optional[SinkHost] = None) -> Any:
        """``call`` on the host's thread (``host``, default the sink's), waited for; its checked result."""
        host = host or self.host
        result = host.ask(call, wait=self.wait(call))
        self.check(host)
        return result

    def open(self, run: RunInfo) -> None:
        """``open(run)``, ``held()`` and the first ``flush``, queued as production queues them, then waited for."""
        self.host.open(run)
        self.ask(Call("flush"))

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        """Queue a batch; while the queue is full, wait at most the sink's bound (then its call overran). A call
        that failed since raises here."""
        if not self.host.offer(records, events) and not self.host.failures:
            self.host.overran(Call("write"), self.sink.close_bound)
        self.check(self.host)

    def flush(self) -> None:
        self.ask(Call("flush"))

    def close(self, status: str, since: Optional[float] = None) -> str:
        """``close(status)`` and the final ``undelivered()``, waited for the close's bound from ``since`` (default:
        now); returns the latter's text. A host whose call hung is not waited for again."""
        final = self.host.close(status)
        waited, start = self.wait(Call("close")), time.monotonic() if since is None else since
        if not self.host.hung and not self.host.closed.wait(max(0.0, start + waited - time.monotonic())):
            self.host.overran(Call("close"), waited)
        self.check(self.host)
        return final.result or ""

    def check(self, host: SinkHost) -> None:
        """Raise ``error`` with ``host``'s first failure, if it has one."""
        if host.failures:
            raise self.error(str(host.failures[0]))
