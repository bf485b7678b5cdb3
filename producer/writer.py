"""The Pulsar-free core of `WatermarkProducer`: which markers it writes, and when.

`MarkerWriter` takes a `MarkerSink` (the function that hands a marker to every partition) and its
clocks as arguments, so the builder, transactions, the keepalive and ingestion-time watermarks
are all tested without a broker. `WatermarkProducer` plugs in the Pulsar producer.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from producer.ingestion import StampOrder, wall_clock_ms
from producer.schedule import Tick, TickerSchedule
from watermark_core.protocol import MarkerKind, encode_idle, encode_set, encode_txn_abort, encode_txn_commit

log = logging.getLogger(__name__)

SendCallback = Callable[[Any, Any], None]
"""`callback(result, message_id)` of `pulsar.Producer.send_async`."""

R = TypeVar("R")


class MarkerSink(Protocol):
    """Hands one marker to Pulsar: one copy per partition, in the producer's order."""

    def send(self, kind: MarkerKind, payload: bytes) -> list[Any]:
        """Send to every partition and wait; one message id per partition."""
        ...

    def send_async(self, kind: MarkerKind, payload: bytes, callback: SendCallback | None) -> None:
        """Hand to every partition without waiting; `callback` once all partitions answered."""
        ...


class TransactionClosedError(ValueError):
    """A watermark transaction was used after its commit or abort."""


class MarkerWriter:
    """Sends a producer's markers through `sink` and keeps what the ticker needs to know.

    `label` names the producer in errors and logs; `monotonic` (seconds) and `wall_ms` (ms since the
    epoch) are the clocks, replaceable for tests.
    """

    def __init__(
        self,
        sink: MarkerSink,
        label: str,
        *,
        keepalive_s: float | None,
        ingestion_s: float | None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._sink = sink
        self.label = label
        self._monotonic = monotonic
        self.schedule = TickerSchedule(keepalive_s, ingestion_s) if keepalive_s or ingestion_s else None
        self.ingestion = bool(ingestion_s)
        self.stamps = StampOrder(wall_ms)
        self._lock = threading.RLock()
        """Orders markers and the state they leave; held while a marker is handed over."""
        self._last_event_time: int | None = None
        self._idle = False
        self._last_marker_at = monotonic()
        self._last_ingestion_at = self._last_marker_at
        self.closed = False

    @property
    def last_watermark(self) -> int | None:
        """What the log says this producer asserts: its latest W_SET (committed ones included), None
        before the first or while idle. This is what the keepalive re-sends."""
        return None if self._idle else self._last_event_time

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"watermark producer {self.label} is closed")

    def in_order(self, action: Callable[[], R]) -> R:
        """Run `action` in order with every marker (e.g. the sink covering partitions added to the topic)."""
        with self._lock:
            self.check_open()
            return action()

    # -- data -----------------------------------------------------------------------------------------

    def send_data(self, send: Callable[[int | None], R]) -> R:
        """Hand a data message to Pulsar with `send(event_timestamp)`: an ingestion-time stamp or None."""
        if self.ingestion:
            return self.stamps.send_data(send)
        return send(None)

    # -- markers --------------------------------------------------------------------------------------

    def _send_marker(
        self,
        kind: MarkerKind,
        payload: bytes,
        record: Callable[[], None],
        *,
        asserts: int | None = None,
        sync: bool = True,
        callback: SendCallback | None = None,
    ) -> list[Any]:
        """Hand a marker to every partition (and wait for them if `sync`), then `record()` what it did.

        One lock orders every marker (the application's and the ticker's): the log has them in the
        order their effects are recorded, so the keepalive never re-sends a state a later marker
        already replaced. The send time is taken before the hand-over, so it is never after the
        marker's publish time. A marker that makes the producer assert `asserts` (a W_SET, or the
        commit of one) is handed over in order with the ingestion-time stamps (`StampOrder`).
        """

        def hand_over(_: int) -> list[Any]:
            if sync:
                return self._sink.send(kind, payload)
            self._sink.send_async(kind, payload, callback)
            return []

        with self._lock:
            self.check_open()
            self._last_marker_at = self._monotonic()
            ids = hand_over(0) if asserts is None else self.stamps.send_set(asserts, hand_over)
            record()
            return ids

    def _send_ingestion_set(self) -> None:
        """The ticker's W_SET of the wall clock, or of the lowest ingestion-time stamp not handed over yet."""

        def hand_over(event_time: int) -> None:
            self._sink.send_async(MarkerKind.W_SET, encode_set(event_time), None)
            self._asserted(event_time)

        with self._lock:
            self.check_open()
            self._last_marker_at = self._monotonic()
            self.stamps.send_set(None, hand_over)

    def _asserted(self, event_time: int) -> None:
        self._last_event_time = event_time
        self._idle = False

    def _went_idle(self) -> None:
        self._idle = True

    # -- the ticker -----------------------------------------------------------------------------------

    def run_ticker(self, wait: Callable[[float], bool]) -> None:
        """The ticker thread's loop: `wait(timeout_s)` sleeps like `threading.Event.wait` (True: stop)."""
        wake = self._monotonic()
        while not wait(max(0.0, wake - self._monotonic())):
            wake = self.tick()

    def tick(self) -> float:
        """One wake-up of the ticker: send what is due; returns when (monotonic) to wake up next."""
        assert self.schedule is not None, "tick() without a keepalive or ingestion interval"
        with self._lock:  # a marker in progress first: it may be the one that makes a keepalive unnecessary
            action, wake = self._plan()
            if action is Tick.NOTHING:
                return wake
            try:
                if action is Tick.INGESTION:
                    self._last_ingestion_at = self._monotonic()
                    self._send_ingestion_set()
                else:
                    assert self._last_event_time is not None
                    kept = self._last_event_time
                    self._send_marker(
                        MarkerKind.W_SET, encode_set(kept), lambda: self._asserted(kept), asserts=kept, sync=False
                    )
            except Exception:  # a broker hiccup must not kill the ticker; the next keepalive retries
                log.warning("watermark keepalive for %s failed", self.label, exc_info=True)
            action, wake = self._plan()
            # Still due: the marker was not handed over. Try again one interval later, not in a loop.
            return wake if action is Tick.NOTHING else self._monotonic() + self.schedule.shortest_s

    def _plan(self) -> tuple[Tick, float]:
        assert self.schedule is not None
        return self.schedule.plan(
            self._monotonic(), self._last_marker_at, self._last_ingestion_at, self._last_event_time, self._idle
        )


class WatermarkTransaction:
    """Watermarks sent inside it are pending until `commit()`; `abort()` discards them."""

    def __init__(self, writer: MarkerWriter) -> None:
        self.txn_id = uuid.uuid4().hex
        self._writer = writer
        self._pending: tuple[MarkerKind, int | None] | None = None
        """The latest marker sent inside it (the latest wins, as in the log): what its commit applies."""
        self._outcome: str | None = None

    @property
    def closed(self) -> bool:
        return self._outcome is not None

    def _check_open(self) -> None:
        if self._outcome is not None:
            raise TransactionClosedError(
                f"watermark transaction {self.txn_id} was already {self._outcome}; start a new one with "
                "producer.new_transaction()"
            )

    def commit(self) -> None:
        """The pending watermark takes effect at the commit's position in the log."""
        self._check_open()
        asserts = self._pending[1] if self._pending is not None else None
        self._writer._send_marker(
            MarkerKind.W_TXN_COMMIT, encode_txn_commit(self.txn_id), self._committed, asserts=asserts
        )
        self._outcome = "committed"

    def _committed(self) -> None:
        """The commit applies the pending marker, W_SET or W_IDLE: the keepalive must see it too."""
        if self._pending is not None:
            kind, event_time = self._pending
            if event_time is not None:
                self._writer._asserted(event_time)
            elif kind is MarkerKind.W_IDLE:
                self._writer._went_idle()

    def abort(self) -> None:
        self._check_open()
        self._writer._send_marker(MarkerKind.W_TXN_ABORT, encode_txn_abort(self.txn_id), lambda: None)
        self._outcome = "aborted"


class WatermarkBuilder:
    """`producer.new_watermark().event_time(t).send()` or `.mark_idle().send()`."""

    def __init__(self, writer: MarkerWriter, txn: WatermarkTransaction | None) -> None:
        self._writer = writer
        self._txn = txn
        self._event_time: int | None = None
        self._idle = False

    def event_time(self, event_time_ms: int) -> WatermarkBuilder:
        """Assert that every later message of this producer has event time >= `event_time_ms`."""
        encode_set(event_time_ms)  # validates: a non-negative integer of milliseconds
        self._event_time = event_time_ms
        self._idle = False
        return self

    def mark_idle(self) -> WatermarkBuilder:
        """Leave this producer out of the watermark until its next `W_SET`."""
        self._idle = True
        self._event_time = None
        return self

    def _payload(self) -> tuple[MarkerKind, bytes]:
        if self._txn is not None:
            self._txn._check_open()
        txn_id = self._txn.txn_id if self._txn is not None else None
        if self._idle:
            return MarkerKind.W_IDLE, encode_idle(txn_id)
        if self._event_time is None:
            raise ValueError("a watermark needs .event_time(t_ms) or .mark_idle() before .send()")
        return MarkerKind.W_SET, encode_set(self._event_time, txn_id)

    def _record(self) -> None:
        """What the marker did, as the log will fold it: the producer's state, or its transaction's."""
        if self._txn is not None:
            self._txn._pending = (MarkerKind.W_IDLE, None) if self._idle else (MarkerKind.W_SET, self._event_time)
        elif self._idle:
            self._writer._went_idle()
        elif self._event_time is not None:
            self._writer._asserted(self._event_time)

    def send(self) -> list[Any]:
        """Send the marker to every partition and wait; returns one message id per partition."""
        kind, payload = self._payload()
        return self._writer._send_marker(kind, payload, self._record, asserts=self._asserts())

    def send_async(self, callback: SendCallback | None = None) -> None:
        """Send without waiting; `callback(result, message_id)` runs once all partitions answered."""
        kind, payload = self._payload()
        self._writer._send_marker(kind, payload, self._record, asserts=self._asserts(), sync=False, callback=callback)

    def _asserts(self) -> int | None:
        """The event time this marker makes the producer assert at once (not inside a transaction)."""
        return self._event_time if self._txn is None and not self._idle else None
