"""A Pulsar consumer that hides markers and hands the subscription's watermark to the application.

Markers are acknowledged as soon as they arrive, so they never hold back the subscription's
mark-delete position (which is what the generator's watermark follows). With a listener, data
messages and watermarks pass through one queue and one thread, so the listener sees them in the
order they happened, each once. Options the wrapper does not own pass through to `subscribe`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import Counter
from typing import Any

import pulsar

from consumer.listener import WatermarkListener
from consumer.watermark_feed import WatermarkFeed
from pulsar_access.errors import explained, service_url_of
from watermark_core.protocol import MARKER_PROPERTY, MalformedMarker, Watermark, decode_marker, position_of

log = logging.getLogger(__name__)

NO_WATERMARK_WARNING_S = 30.0
_STOP = object()


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
        **subscribe_options: Any,
    ) -> None:
        if "message_listener" in subscribe_options:
            raise ValueError("pass a WatermarkListener as listener=..., not message_listener")
        self.topic = topic
        self.subscription = subscription
        self._listener = listener
        self.markers_hidden = 0
        self.late_messages = 0
        self.malformed_markers: Counter[str] = Counter()
        self._late: weakref.WeakSet[pulsar.Message] = weakref.WeakSet()
        self._delivered: Watermark | None = None
        self._closed = False
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=subscribe_options.get("receiver_queue_size", 1000))
        self._dispatcher: threading.Thread | None = None
        self._subscribed = threading.Event()
        """Set once `subscribe` returned: the client may call the listener before it does."""
        # A broker that is down, a wrong URL, a missing namespace or a refused token: one clear error,
        # and no thread or reader left running behind it.
        with explained(service_url=service_url_of(client), topic=topic, doing="subscribe to"):
            self._feed = WatermarkFeed(client, topic, subscription, self._on_watermark)
            try:
                if listener is not None:
                    self._dispatcher = threading.Thread(
                        target=self._dispatch, name=f"wm-listener-{subscription}", daemon=True
                    )
                    self._dispatcher.start()
                    subscribe_options["message_listener"] = self._on_message
                if self._feed.current is not None:
                    self._on_watermark(self._feed.current)
                self._consumer = client.subscribe(topic, subscription, **subscribe_options)
            except BaseException:
                self._subscribed.set()
                self._stop_dispatcher()
                self._feed.close()
                raise
        self._subscribed.set()
        self._warning = threading.Timer(no_watermark_warning_s, self._warn_if_no_watermark)
        self._warning.daemon = True
        self._warning.start()

    # -- watermarks ----------------------------------------------------------------------------------

    def get_last_watermark(self) -> Watermark | None:
        """The latest watermark of this subscription (the minimum over its partitions), or None."""
        if self._listener is not None:
            return self._delivered
        return self._feed.current

    def _on_watermark(self, watermark: Watermark) -> None:
        if self._listener is not None:
            self._queue.put(watermark)

    def _warn_if_no_watermark(self) -> None:
        if self._feed.current is None and not self._closed:
            log.warning(
                "no watermark arrived for subscription %r of %s within %.0f s; messages are still delivered. "
                "Is the watermark generator ('broker-ext serve') running and following this topic?",
                self.subscription, self.topic, self._warning.interval,
            )  # fmt: skip

    # -- messages ------------------------------------------------------------------------------------

    def _hide_marker(self, message: pulsar.Message, properties: dict[str, str]) -> None:
        """Acknowledge and drop a marker, counting (and logging once per kind) a malformed one."""
        msg_id = message.message_id()
        try:
            decode_marker(
                properties,
                message.data(),
                message.producer_name(),
                position_of(msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index()),
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
        self._consumer.acknowledge(message)

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
        if timeout_millis is None:
            message = self._consumer.receive()
        else:
            deadline = time.monotonic() + timeout_millis / 1000
            message = self._consumer.receive(timeout_millis=timeout_millis)
        properties = message.properties()
        while MARKER_PROPERTY in properties:
            self._hide_marker(message, properties)
            if timeout_millis is None:
                message = self._consumer.receive()
            else:
                message = self._consumer.receive(timeout_millis=max(0, int((deadline - time.monotonic()) * 1000)))
            properties = message.properties()
        self._note_lateness(message, self._feed.current)
        return message

    def _on_message(self, _consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        """Runs on the client's listener thread: hide markers, queue data for the dispatcher.

        Waits for `subscribe` to return first: the first messages can arrive before it does, and
        acknowledging them (a marker here, data in the listener) needs the consumer it returns.
        """
        self._subscribed.wait()
        if self._closed or "_consumer" not in self.__dict__:
            return
        try:
            properties = message.properties()
            if MARKER_PROPERTY in properties:
                self._hide_marker(message, properties)
            else:
                self._queue.put(message)
        except Exception:
            log.exception("handling message %s of %s failed", message.message_id(), self.topic)

    def _dispatch(self) -> None:
        """The one thread that calls the listener, for messages and watermarks alike."""
        assert self._listener is not None
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                if isinstance(item, Watermark):
                    if item != self._delivered:
                        self._delivered = item
                        self._listener.received_watermark(self, item)
                else:
                    self._note_lateness(item, self._delivered)
                    self._listener.received(self, item)
            except Exception:
                log.exception("the listener of %r on %s raised; continuing", self.subscription, self.topic)

    # -- pass-through --------------------------------------------------------------------------------

    def acknowledge(self, message: Any) -> None:
        self._consumer.acknowledge(message)

    def acknowledge_cumulative(self, message: Any) -> None:
        self._consumer.acknowledge_cumulative(message)

    def negative_acknowledge(self, message: Any) -> None:
        self._consumer.negative_acknowledge(message)

    def __getattr__(self, name: str) -> Any:
        """Everything else (`seek`, `unsubscribe`, ...) is the underlying `pulsar.Consumer`'s."""
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
            self._queue.put(_STOP)
            self._dispatcher.join(timeout=5)

    def __enter__(self) -> WatermarkConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
