"""A Pulsar consumer that hides markers and hands the subscription's watermark to the application.

Markers are acknowledged as soon as they arrive, so they never hold back the subscription's
mark-delete position (which is what the generator's watermark follows). With a listener, data
messages and watermarks pass through one queue and one thread, so the listener sees them in the
order they happened, each once. Options the wrapper does not own pass through to `subscribe`.

A watermark holds only for messages after the position it was computed at. When the subscription
moves back (`seek`, an operator's reset-cursor, a redelivery of something acknowledged), the
consumer stops trusting its watermark at once (watermark_core/trust.py): a listener gets no
message of that partition until the watermark recomputed before it has been handed over (or
taken away with `watermark_withdrawn` when the recomputed state has none); `get_last_watermark()`
of a consumer without listener returns None meanwhile.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import pulsar

from consumer.listener import WatermarkListener
from consumer.watermark_feed import RECOMPUTE_WAIT_S, WatermarkFeed
from pulsar_access.errors import explained, service_url_of
from watermark_core.protocol import (
    MARKER_PROPERTY,
    MalformedMarker,
    Position,
    Watermark,
    decode_marker,
    position_of,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

NO_WATERMARK_WARNING_S = 30.0
_STOP = object()
_WAKE = object()
"""Queued by the feed: what the listener may hold can have changed."""


class WatermarkConsumer:
    """`WatermarkConsumer(client, topic, subscription, listener=None, **subscribe_options)`."""

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        subscription: str,
        listener: WatermarkListener | None = None,
        *,
        no_watermark_warning_s: float = NO_WATERMARK_WARNING_S,
        recompute_wait_s: float = RECOMPUTE_WAIT_S,
        **subscribe_options: Any,
    ) -> None:
        if "message_listener" in subscribe_options:
            raise ValueError("pass a WatermarkListener as listener=..., not message_listener")
        self.topic = topic
        self.subscription = subscription
        self._client = client
        self._listener = listener
        self.markers_hidden = 0
        self.late_messages = 0
        self.malformed_markers: Counter[str] = Counter()
        self._late: weakref.WeakSet[pulsar.Message] = weakref.WeakSet()
        self._delivered: Watermark | None = None
        self._wake_queued = threading.Event()
        self._closed = False
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=subscribe_options.get("receiver_queue_size", 1000))
        self._dispatcher: threading.Thread | None = None
        self._subscribed = threading.Event()
        """Set once `subscribe` returned: the client may call the listener before it does."""
        # A broker that is down, a wrong URL, a missing namespace or a refused token: one clear error,
        # and no thread or reader left running behind it.
        with explained(service_url=service_url_of(client), topic=topic, doing="subscribe to"):
            self._feed = WatermarkFeed(
                client, topic, subscription, self._on_watermark, recompute_wait_s=recompute_wait_s,
            )  # fmt: skip
            try:
                if listener is not None:
                    self._dispatcher = threading.Thread(
                        target=self._dispatch, name=f"wm-listener-{subscription}", daemon=True
                    )
                    self._dispatcher.start()
                    subscribe_options["message_listener"] = self._on_message
                self._on_watermark(self._feed.current)
                self._subscribe: Callable[[], pulsar.Consumer] = functools.partial(
                    client.subscribe, topic, subscription, **subscribe_options
                )
                self._consumer = self._subscribe()
            except BaseException:
                self._subscribed.set()
                self._stop_dispatcher()
                self._feed.close()
                raise
        self._subscribed.set()
        self._inclusive_seek = bool(subscribe_options.get("start_message_id_inclusive", False))
        self._seek_targets: dict[int, tuple[int, int]] = {}
        """Partition -> the entry of a seek by message id that delivery resumes after: dropped (and
        acknowledged) if it is the first message of the partition that comes after the seek."""
        self._warning = threading.Timer(no_watermark_warning_s, self._warn_if_no_watermark)
        self._warning.daemon = True
        self._warning.start()

    # -- watermarks ----------------------------------------------------------------------------------

    def get_last_watermark(self) -> Watermark | None:
        """The latest watermark of this subscription (the minimum over its partitions), or None.

        With a listener: the one the listener holds (no message is handed over under a watermark
        computed at or after it). Without: the trusted one, None while the subscription has none
        or has moved back and the watermark recomputed before the messages coming again is not in yet.
        """
        if self._listener is not None:
            return self._delivered
        return self._feed.current

    def _on_watermark(self, _current: Watermark | None) -> None:
        """The feed's news (on its thread): wake the dispatcher, never blocking the feed."""
        if self._listener is not None and not self._wake_queued.is_set():
            self._wake_queued.set()
            try:
                self._queue.put_nowait(_WAKE)
            except queue.Full:  # the dispatcher is busy with messages and looks before each of them
                self._wake_queued.clear()

    def _warn_if_no_watermark(self) -> None:
        if self._feed.current is None and not self._closed:
            log.warning(
                "no watermark arrived for subscription %r of %s within %.0f s; messages are still delivered. "
                "Is the watermark generator ('broker-ext serve') running and following this topic?",
                self.subscription, self.topic, self._warning.interval,
            )  # fmt: skip

    # -- messages ------------------------------------------------------------------------------------

    def _position(self, message_or_id: Any) -> tuple[int, Position]:
        """(partition, position) of a message or a message id, as the feed names partitions."""
        msg_id = message_or_id.message_id() if hasattr(message_or_id, "message_id") else message_or_id
        partition = self._feed.partition_of(msg_id.partition())
        return partition, position_of(msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index())

    def _observe(self, message: pulsar.Message, *, queued: bool = False) -> None:
        self._feed.observe(*self._position(message), queued=queued)

    def _hide_marker(self, message: pulsar.Message, properties: dict[str, str]) -> None:
        """Acknowledge and drop a marker, counting (and logging once per kind) a malformed one."""
        msg_id = message.message_id()
        try:
            decode_marker(
                properties,
                message.data(),
                message.producer_name(),
                self._position(msg_id)[1],
                message.publish_timestamp(),
            )
            self.markers_hidden += 1
        except MalformedMarker as exc:
            self.malformed_markers[exc.reason] += 1
            if self.malformed_markers[exc.reason] == 1:
                log.warning(
                    "skipping malformed marker (%s) from %r at %s on %s: %s",
                    exc.reason, message.producer_name(), msg_id, message.topic_name(), exc,
                )  # fmt: skip
        self.acknowledge(message)

    def _note_lateness(self, message: pulsar.Message, watermark: Watermark | None) -> None:
        if watermark is not None:
            event_time = message.event_timestamp()
            if event_time and event_time < watermark.event_time:
                self.late_messages += 1
                self._late.add(message)

    def is_late(self, message: pulsar.Message) -> bool:
        """True if the message's event time was below this consumer's watermark when it was handed over."""
        return message in self._late

    def receive(self, timeout_millis: int | None = None) -> pulsar.Message:
        """The next data message; markers are acknowledged and skipped within the same timeout."""
        if self._listener is not None:
            raise RuntimeError("this consumer has a listener; messages go to it, not to receive()")
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000
        message = self._receive_before(deadline)
        self._observe(message)
        properties = message.properties()
        while MARKER_PROPERTY in properties or self._is_seek_target(message, observed=True):
            if MARKER_PROPERTY in properties:
                self._hide_marker(message, properties)
            message = self._receive_before(deadline)
            self._observe(message)
            properties = message.properties()
        self._note_lateness(message, self._feed.current)
        return message

    def _receive_before(self, deadline: float | None) -> pulsar.Message:
        """The Pulsar consumer's next message, waiting at most until `deadline` (None: as long as it takes)."""
        if deadline is None:
            return self._on_consumer(lambda c: c.receive())
        left = max(0, int((deadline - time.monotonic()) * 1000))
        return self._on_consumer(lambda c: c.receive(timeout_millis=left))

    def _on_message(self, _consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        """Runs on the client's listener thread: hide markers, queue data for the dispatcher.

        Waits for `subscribe` to return first: the first messages can arrive before it does, and
        acknowledging them (a marker here, data in the listener) needs the consumer it returns.
        """
        self._subscribed.wait()
        if self._closed or "_consumer" not in self.__dict__:
            return
        try:
            if self._is_seek_target(message):
                return
            properties = message.properties()
            is_marker = MARKER_PROPERTY in properties
            self._observe(message, queued=not is_marker)
            if is_marker:
                self._hide_marker(message, properties)
            else:
                self._queue.put(message)
        except Exception:
            if self._closed:  # closed meanwhile (e.g. acknowledging a marker): the broker redelivers it
                log.debug("message %s of %s arrived while closing", message.message_id(), self.topic, exc_info=True)
            else:
                log.exception("handling message %s of %s failed", message.message_id(), self.topic)

    def _dispatch(self) -> None:
        """The one thread that calls the listener, for messages and watermarks alike.

        Before each message it waits until the message's partition is trusted (the watermark
        recomputed after a move back has arrived) and hands over what the listener may hold then.
        """
        assert self._listener is not None
        while True:
            item = self._queue.get()
            if item is _STOP or self._closed:
                return
            try:
                if item is _WAKE:
                    self._wake_queued.clear()
                    self._hand_watermark()
                    continue
                if not self._feed.wait_to_hand_over(self._position(item)[0], lambda: self._closed):
                    return
                try:
                    self._hand_watermark()
                finally:  # after the watermark it comes under; and never left counted as queued
                    self._feed.handed_over(*self._position(item))
                self._note_lateness(item, self._delivered)
                self._listener.received(self, item)
            except Exception:
                log.exception("the listener of %r on %s raised; continuing", self.subscription, self.topic)

    def _hand_watermark(self) -> None:
        """Hand the listener what it may hold now: a new value, or none; the same value silently."""
        assert self._listener is not None
        new = self._feed.listener_watermark(self._delivered)
        previous, self._delivered = self._delivered, new
        if new == previous:
            return  # the same event time (maybe computed at other positions): not handed over again
        if new is None:
            self._listener.watermark_withdrawn(self)
        else:
            self._listener.received_watermark(self, new)

    # -- pass-through --------------------------------------------------------------------------------

    def acknowledge(self, message: Any) -> None:
        """Acknowledge a message or message id; held back while it would let the subscription pass a
        position it moved back to before the watermark recomputed there has arrived (then sent)."""
        partition, position = self._position(message)
        self._feed.acknowledge(partition, position, lambda: self._on_consumer(lambda c: c.acknowledge(message)))

    def acknowledge_cumulative(self, message: Any) -> None:
        partition, position = self._position(message)
        self._feed.acknowledge(
            partition, position, lambda: self._on_consumer(lambda c: c.acknowledge_cumulative(message)),
            cumulative=True,
        )  # fmt: skip

    def negative_acknowledge(self, message: Any) -> None:
        self._on_consumer(lambda c: c.negative_acknowledge(message))

    def _on_consumer(self, action: Callable[[pulsar.Consumer], T]) -> T:
        """`action(consumer)` on the current Pulsar consumer; once more on its successor if a seek replaced it
        meanwhile (`_renew`)."""
        self._subscribed.wait()
        consumer = self._consumer
        try:
            return action(consumer)
        except pulsar.AlreadyClosed:
            self._subscribed.wait()
            if self._closed or self._consumer is consumer:
                raise
            return action(self._consumer)

    def seek(self, target: Any) -> None:
        """Pulsar's `seek` (a message id, or an int publish time in ms), and distrust the watermark at once.

        Messages received before the seek and not handed to the listener yet are dropped, as the
        Pulsar client drops those it had not delivered: delivery starts again from the target.

        By message id the Pulsar client resumes *after* the target (unless subscribed with
        `start_message_id_inclusive=True`) but the broker's cursor stays before it, so nobody
        would ever acknowledge it and the subscription, and its watermark, would stay there for
        good; this consumer acknowledges the target itself (a message that is not batched).
        The Pulsar client (C++, 3.x) also keeps the target as its start message id for as long as
        the consumer lives: it drops every later delivery of an entry of the target's ledger up to
        the target, unacknowledged and without returning the flow permit it used. When the
        subscription moves back over the target again (a reset-cursor, another consumer's seek),
        a few such entries use up the permits and the broker sends nothing more: the consumer is
        stuck for good (chaos seed 776590, receiver queue 5). So after a seek by message id the
        consumer subscribes again (`_renew`), with no start message id.
        """
        partitions: list[int] | None
        if isinstance(target, int) and not isinstance(target, bool):
            partitions, entry = None, None
        else:
            index = target.partition()
            partitions = [self._feed.partition_of(index)] if index >= 0 or len(self._feed.partitions) == 1 else None
            entry = (target.ledger_id(), target.entry_id())
        if self._listener is not None:  # nothing comes in between: what is queued now came before the seek
            self._consumer.pause_message_listener()
        try:
            self._feed.send_held(partitions)
            self._drop_queued(partitions)
            self._consumer.seek(target)
            self._feed.seek(partitions, entry)
            if entry is not None and partitions is not None:
                self._seek_targets.pop(partitions[0], None)
                if self._skips_target(target):
                    self._seek_targets[partitions[0]] = entry
                self._renew()
        finally:
            if self._listener is not None:
                self._consumer.resume_message_listener()

    def _renew(self) -> None:
        """Close the Pulsar consumer and subscribe again, so that no start message id stays behind (see `seek`).

        Closing sends the acknowledgements it still groups; meanwhile the listener's callback and
        acknowledgements (`_on_consumer`) wait for the new consumer.
        """
        self._subscribed.clear()
        try:
            with contextlib.suppress(pulsar.PulsarException):
                self._consumer.close()
            with explained(service_url=service_url_of(self._client), topic=self.topic, doing="subscribe again to"):
                self._consumer = self._subscribe()
        finally:
            self._subscribed.set()

    def _is_seek_target(self, message: pulsar.Message, *, observed: bool = False) -> bool:
        """Whether `message` is a seek's target coming first after the seek: acknowledged and dropped then, as
        Pulsar resumes after the target (`seek`); any first message of its partition ends the wait for it."""
        if not self._seek_targets:
            return False
        partition, position = self._position(message)
        target = self._seek_targets.pop(partition, None)
        if target is None or position != position_of(*target):
            return False
        if not observed:
            self._observe(message)
        self.acknowledge(message)
        return True

    def _skips_target(self, target: Any) -> bool:
        """Whether Pulsar resumes after `target` without acknowledging it (a real, unbatched message id)."""
        if self._inclusive_seek or target.batch_index() >= 0:
            return False
        ledger, entry = target.ledger_id(), target.entry_id()
        return ledger >= 0 and entry >= 0 and (ledger, entry) != (pulsar.MessageId.latest.ledger_id(),
                                                                   pulsar.MessageId.latest.entry_id())  # fmt: skip

    def _drop_queued(self, partitions: list[int] | None) -> None:
        """Forget the messages of these partitions (None: all) waiting for the listener."""
        if self._listener is None:
            return
        with self._queue.mutex:
            kept = [
                item for item in self._queue.queue
                if not isinstance(item, pulsar.Message)
                or (partitions is not None and self._position(item)[0] not in partitions)
            ]  # fmt: skip
            self._queue.queue.clear()
            self._queue.queue.extend(kept)
            self._queue.not_full.notify_all()

    def __getattr__(self, name: str) -> Any:
        """Everything else (`unsubscribe`, `pause_message_listener`, ...) is the underlying `pulsar.Consumer`'s."""
        return getattr(self._consumer, name)

    def close(self) -> None:
        """Close the consumer; the watermark reader and the listener thread stop even if that fails.

        The error of the underlying close (e.g. the client was closed first) is raised after them.
        """
        if self._closed:
            return
        self._closed = True
        self._warning.cancel()
        try:
            self._consumer.close()
        finally:
            self._feed.close()
            self._stop_dispatcher()

    def _stop_dispatcher(self) -> None:
        if self._dispatcher is not None:
            with contextlib.suppress(queue.Full):  # full: the dispatcher sees `_closed` at its next item
                self._queue.put_nowait(_STOP)
            self._dispatcher.join(timeout=5)

    def __enter__(self) -> WatermarkConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
