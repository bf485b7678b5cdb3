"""A Pulsar consumer that hides markers and hands the subscription's watermark to the application.

Markers are acknowledged as soon as they arrive, so they never hold back the subscription's
mark-delete position (which is what the generator's watermark follows). With a listener, data
messages and watermarks pass through one queue and one thread, so the listener sees them in the
order they happened, each once. Options the wrapper does not own pass through to `subscribe`.

A watermark holds only for messages after the position it was computed at. When the subscription
moves back (`seek`, an operator's reset-cursor, a redelivery of something acknowledged), the
consumer stops trusting its watermark at once: a listener gets no message of that partition until
the watermark recomputed before it has been handed over (or taken away with `watermark_withdrawn`
when the recomputed state has none); `get_last_watermark()` of a consumer without listener returns
None meanwhile. Every such decision is the engine's (consumer/engine.py); this class is its shell:
it turns what the client delivers and what the application calls into the engine's events, and
carries out its commands (a listener's in order, on one thread).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import _pulsar
import pulsar

from consumer.dispatcher import LISTENER_POLL_MS, Dispatcher
from consumer.engine import (
    RECOMPUTE_WAIT_S,
    Acknowledged,
    NegativelyAcknowledged,
    Sought,
)
from consumer.lateness import Lateness
from consumer.listener import Listener
from consumer.trust import Lane, position_of
from consumer.watermark_feed import WatermarkFeed
from pulsar_access.errors import explained, service_url_of
from watermark_core.protocol import (
    MARKER_PROPERTY,
    MalformedMarker,
    Position,
    Watermark,
    decode_marker,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
_Message = pulsar.Message

NO_WATERMARK_WARNING_S = 30.0
_BATCH_END = 2**31 - 1
"""The largest batch index a message id holds: after every message of an entry."""
_monotonic = time.monotonic


def _unbound(cls: type, name: str) -> Any:
    """`cls.name` as the function the binding defines, to be called with the object first. pybind11 keeps a method in
    its class as an `instancemethod`, which every `raw.name()` binds anew (an object made and freed per call)."""
    attribute = cls.__dict__[name]
    return getattr(attribute, "__func__", attribute)


_ACCESSORS = ("properties", "message_id", "event_timestamp")
_UNBOUND_ACCESSORS = tuple(_unbound(_pulsar.Message, name) for name in _ACCESSORS)
"""A binding message's accessors the pull path calls per message, unbound (about 300 instructions less a call)."""
_CALLED_ACCESSORS = tuple(operator.methodcaller(name) for name in _ACCESSORS)
"""The same for a binding of another kind (a test's stand-in): the accessor called by name."""
_key_before = _unbound(_pulsar.MessageId, "__lt__")
"""`a < b` of two lane keys (`_pulsar.MessageId`, see `_message_id_at`) without Python's comparison protocol, which
looks `__lt__` up in the class first (about 300 instructions a message)."""


def _message_id_at(position: Position) -> Any:
    """The lanes' key of a position (consumer/trust.py `Lane`): a message id of the client's binding, the type
    `message_id()` returns, compared with it by `<` alone (which compares ledger, entry and batch index; its `==`
    compares the partition too)."""
    ledger, entry, batch = position
    return _pulsar.MessageId(-1, ledger, entry, batch if batch < _BATCH_END else _BATCH_END)


__all__ = ["LISTENER_POLL_MS", "NO_WATERMARK_WARNING_S", "WatermarkConsumer"]


def _batch_policy_of(policy: pulsar.ConsumerBatchReceivePolicy | None, room: int) -> tuple[int, int, int]:
    """(most messages, most bytes, wait in ms) of a `batch_receive_policy` (the client's default without one); like
    the client, at most the receiver queue's size of messages."""
    if policy is None:
        return -1, 10 * 1024 * 1024, 100
    raw = policy.policy()
    most = raw.getMaxNumMessages()
    return (room if most > room else most), raw.getMaxNumBytes(), raw.getTimeoutMs()


def _collect_batch(receive: Callable[[int], Any], most: int, most_bytes: int, wait_ms: int) -> list[Any]:
    """What the client's `batch_receive` returns, taken with `receive(timeout_ms)`: the messages that come until
    `wait_ms` has passed (negative: no limit) or `most` messages or `most_bytes` bytes are in (negative or 0: no
    limit; the last message may pass `most_bytes`, where the client keeps it for the next batch)."""
    batch: list[Any] = []
    append = batch.append
    limit = most if most > 0 else sys.maxsize
    size = 0
    clock = time.monotonic
    deadline = clock() + wait_ms / 1000 if wait_ms >= 0 else float("inf")
    while len(batch) < limit:
        try:
            raw = receive(0)  # queued already: the common case while reading a backlog
        except pulsar.Timeout:
            left = min(int((deadline - clock()) * 1000), 2**31 - 1)
            if left <= 0:
                break
            try:
                raw = receive(left)
            except pulsar.Timeout:
                break
        append(raw)
        if most_bytes > 0:
            size += raw.length()
            if size >= most_bytes:
                break
        if clock() >= deadline:  # a backlog that never runs dry ends the batch at the timeout too
            break
    return batch


class WatermarkConsumer:
    """`WatermarkConsumer(client, topic, subscription, listener=None, admin_url=None, **subscribe_options)`.

    `admin_url` (default `PULSAR_ADMIN_URL`): where the topic property naming its incarnation is read, so that a
    topic deleted and created again shows none of its old watermarks (docs/DECISIONS.md, "A re-created topic").
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        subscription: str,
        listener: Listener | None = None,
        *,
        no_watermark_warning_s: float = NO_WATERMARK_WARNING_S,
        recompute_wait_s: float = RECOMPUTE_WAIT_S,
        admin_url: str | None = None,
        **subscribe_options: Any,
    ) -> None:
        if "message_listener" in subscribe_options:
            raise ValueError("pass a WatermarkListener as listener=..., not message_listener")
        self.topic = topic
        self.subscription = subscription
        self._client = client
        self._listener = listener
        self.markers_hidden = 0
        self.malformed_markers: Counter[str] = Counter()
        self._lateness = Lateness()
        self._closed = threading.Event()
        room = max(1, int(subscribe_options.get("receiver_queue_size", 1000)))
        self._dispatcher: Dispatcher | None = None
        if listener is not None:
            self._dispatcher = Dispatcher(
                f"wm-listener-{subscription}", listener=listener, consumer=self, receive=self._receive_one,
                full=lambda: self._feed.pending >= room, lateness=self._lateness,
            )  # fmt: skip
        self._subscribed = threading.Event()
        """Set once `subscribe` returned, cleared while a seek replaces the consumer (`_renew`): calls wait for it
        instead of taking the hot path."""
        # A broker that is down, a wrong URL, a missing namespace or a refused token: one clear error,
        # and no thread or reader left running behind it.
        with explained(service_url=service_url_of(client), topic=topic, doing="subscribe to"):
            self._feed = WatermarkFeed(
                client, topic, subscription, lambda _current: None, recompute_wait_s=recompute_wait_s,
                listener=listener is not None,
                perform=self._dispatcher.put if self._dispatcher is not None else None,
                idle=self._dispatcher.idle if self._dispatcher is not None else None,
                acknowledge=self._send_acknowledgement, admin_url=admin_url, key=_message_id_at,
            )  # fmt: skip
            try:
                self._subscribe: Callable[[], pulsar.Consumer] = functools.partial(
                    client.subscribe, topic, subscription, **subscribe_options
                )
                self._attach(self._subscribe())
            except BaseException:
                self._feed.close()
                raise
        self._subscribed.set()
        self._unnamed_partition = self._feed.partition_of(-1)
        """Our name of the partition of a message id with index -1 (the topic's, or one partition's)."""
        one = self._feed.partitions == [self._unnamed_partition] and not self._feed.follows_new_partitions
        self._only_partition = self._unnamed_partition if one else None
        """The one partition every message comes from (a topic without partitions, or one partition of one)."""
        self._lanes: dict[int, Lane] = self._feed.lanes
        self._only_lane = self._lanes[self._unnamed_partition] if one else None
        """Its lane (consumer/trust.py `Lane`): the pull path's, without a look-up."""
        self._lane_token = self._feed.lane_token
        """The right to write the lanes (the feed's `lane_token`), which a message holds going through a lane."""
        if self._dispatcher is not None:  # the feed queued what the catch-up found (`Attached`), first
            self._dispatcher.start()
        self._batch_policy = _batch_policy_of(subscribe_options.get("batch_receive_policy"), room)
        self._inclusive_seek = bool(subscribe_options.get("start_message_id_inclusive", False))
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
        if self._dispatcher is not None:
            return self._dispatcher.handed
        return self._feed.current

    def _warn_if_no_watermark(self) -> None:
        if self._feed.current is None and not self._closed.is_set():
            log.warning(
                "no watermark arrived for subscription %r of %s within %.0f s; messages are still delivered. "
                "Is the watermark generator ('broker-ext serve') running and following this topic?",
                self.subscription, self.topic, self._warning.interval,
            )  # fmt: skip

    # -- messages ------------------------------------------------------------------------------------
    #
    # Per message, the pull path (`receive`, `batch_receive`, `acknowledge`) does what the plain client does plus what
    # a correct consumer cannot skip: the marker property, the message's position and one comparison with the
    # partition's lane (consumer/trust.py `Lane`, holding the feed's `lane_token` for a message, without it for an
    # acknowledgement), and `event_timestamp` for `late_messages` while a watermark is held. The position is the
    # message id the client's binding returns, kept as it is: it is the lanes' key (`_message_id_at`), compared with
    # the binding's own `<`, and the rule asks it for ledger, entry and batch index only where it needs a position
    # (consumer/trust.py `position_of`). It rides on the message as `_wm_at` (and its lane as `_wm_lane` when the
    # consumer reads several partitions), for `acknowledge`.
    #
    # Written inline, on purpose, in `receive` (the same lines as `_wrap` and the lane's protocol, whose other home is
    # the feed's `received`): no Python call of ours, no object but the `pulsar.Message` the application keeps (a call
    # of ours costs about what a binding call does, docs/DECISIONS.md, "The pull path at the speed of a position").
    # `batch_receive` calls `_wrap` (0.7 k instructions a message more in the stand-in, on a path far above its goal)
    # and writes the lane's protocol inline under the lock it holds over the batch. Everything else (markers, the
    # listener's thread, every message a lane does not let through) takes the cold path: `_wrap`, then the feed's
    # `received` (the engine decides).

    def _partition_of(self, key: Any) -> int:
        """Our name of the partition of a message id (the feed's: -1 from one partition's consumer is that one)."""
        index: int = key.partition()
        return index if index >= 0 else self._unnamed_partition

    def _wrap(self, raw: Any) -> tuple[pulsar.Message, Any, Lane | None]:
        """The `pulsar.Message` of what the client's binding returned, as the client wraps it, with its message id
        (the lanes' key, `_wm_at`) and its partition's lane (None: a partition the engine does not follow yet)."""
        key = self._accessors[1](raw)
        message = _Message()
        message._message = raw
        message._schema = self._schema
        message._wm_at = key
        lane = self._only_lane
        if lane is None:
            lane = message._wm_lane = self._lanes.get(self._partition_of(key))
        return message, key, lane

    def _marker(self, raw: Any) -> None:
        """A marker: the engine skips it and it is acknowledged (the feed's `received`: through the lane when it is
        open both ways, else the engine's); counted (a malformed one logged once per kind)."""
        message, key, _lane = self._wrap(raw)
        self._feed.received(self._partition_of(key), key, message, True)
        try:
            decode_marker(raw.properties(), message.data(), message.producer_name(), position_of(key),
                          message.publish_timestamp())  # fmt: skip
            self.markers_hidden += 1
        except MalformedMarker as exc:
            self.malformed_markers[exc.reason] += 1
            if self.malformed_markers[exc.reason] == 1:
                log.warning(
                    "skipping malformed marker (%s) from %r at %s on %s: %s",
                    exc.reason, message.producer_name(), message.message_id(), message.topic_name(), exc,
                )  # fmt: skip

    def _position(self, message_or_id: Any) -> tuple[int, Position]:
        """(partition, position) of a message or a message id, as the feed names partitions."""
        key = getattr(message_or_id, "_wm_at", None)  # on every message received
        if key is None:
            key = message_or_id.message_id() if hasattr(message_or_id, "message_id") else message_or_id
        return self._partition_of(key), position_of(key)

    @property
    def late_messages(self) -> int:
        """How many messages were handed over with an event time below the watermark held then."""
        return self._lateness.count

    def is_late(self, message: pulsar.Message) -> bool:
        """True if the message's event time was below this consumer's watermark when it was handed over."""
        return message in self._lateness

    def receive(self, timeout_millis: int | None = None) -> pulsar.Message:
        """The next data message; markers are acknowledged and skipped within the same timeout."""
        if self._listener is not None:
            raise RuntimeError("this consumer has a listener; messages go to it, not to receive()")
        started = None if timeout_millis is None else _monotonic()
        left = timeout_millis
        properties, message_id, event_timestamp = self._accessors
        while True:
            receive = self._raw_receive  # (a local: a call through `self.` looks an instance's attribute up slowly)
            try:
                raw = receive() if left is None else receive(left)
            except pulsar.AlreadyClosed:  # a seek is replacing the consumer (`_renew`)
                raw = self._receive_raw(left)
            if MARKER_PROPERTY not in properties(raw):
                key = message_id(raw)  # `_wrap`, inline
                message = _Message()
                message._message = raw
                message._schema = self._schema
                message._wm_at = key
                lane = self._only_lane
                if lane is None:
                    lane = message._wm_lane = self._lanes.get(self._partition_of(key))
                if lane is not None:  # the lane's protocol (consumer/trust.py `Lane`), inline
                    token = self._lane_token
                    try:
                        token.pop()  # the right to write the lanes (the feed's `lane_token`), without waiting
                    except IndexError:  # the engine decides meanwhile: it decides this one too (`received`, below)
                        pass
                    else:
                        try:
                            if lane.receiving and _key_before(lane.after, key):
                                lane.after = key
                                lane.arrived.append(key)
                                current = self._feed.current  # `Lateness.judge`, inline
                                if current is not None:
                                    event_time = event_timestamp(raw)
                                    if event_time and event_time < current.event_time:
                                        self._lateness.late(message)
                                return message
                        finally:
                            token.append(True)
                if self._feed.received(self._partition_of(key), key, message):
                    self._lateness.judge(message, self._feed.current)
                    return message
            else:
                self._marker(raw)
            if started is not None:
                assert timeout_millis is not None
                left = max(0, timeout_millis - int((_monotonic() - started) * 1000))

    def batch_receive(self) -> list[pulsar.Message]:
        """The client's `batch_receive` (see its `batch_receive_policy`) with the markers taken out (they are
        acknowledged here), and the seek target Pulsar would deliver again; may be empty.

        The batch is collected with `receive` under the same policy (`_collect_batch`): the client's own waits for
        its listener thread and the wall clock, and either can stall it for good (docs/DECISIONS.md)."""
        if self._listener is not None:
            raise RuntimeError("this consumer has a listener; messages go to it, not to batch_receive()")
        batch = self._on_raw(lambda c: _collect_batch(c.receive, *self._batch_policy))
        delivered: list[pulsar.Message] = []
        append = delivered.append
        feed, wrap = self._feed, self._wrap
        deciding = feed.deciding
        properties, _, event_timestamp = self._accessors
        current = feed.current
        deciding.__enter__()  # the feed's lock and the lanes' token, held over the batch, let go around the engine
        try:
            for raw in batch:
                if MARKER_PROPERTY in properties(raw):
                    deciding.__exit__()
                    try:
                        self._marker(raw)
                    finally:
                        deciding.__enter__()
                    current = feed.current
                    continue
                message, key, lane = wrap(raw)
                if lane is not None and lane.receiving and _key_before(lane.after, key):  # the lane's protocol, inline
                    lane.after = key
                    lane.arrived.append(key)
                else:
                    deciding.__exit__()
                    try:
                        taken = feed.received(self._partition_of(key), key, message)
                    finally:
                        deciding.__enter__()
                    current = feed.current
                    if not taken:
                        continue
                if current is not None:  # `Lateness.judge`, inline
                    event_time = event_timestamp(raw)
                    if event_time and event_time < current.event_time:
                        self._lateness.late(message)
                append(message)
        finally:
            deciding.__exit__()
        return delivered

    def _receive_raw(self, timeout_millis: int | None) -> Any:
        """The next message from the client's binding (`_pulsar`, what `pulsar.Consumer.receive` calls) while a seek
        replaces the Pulsar consumer (`receive` calls `self._raw` itself otherwise), waiting at most `timeout_millis`
        (None: as long as it takes)."""
        if timeout_millis is None:
            return self._on_raw(lambda c: c.receive())
        return self._on_raw(lambda c: c.receive(timeout_millis))

    def _receive_one(self, timeout_millis: int) -> pulsar.Message | None:
        """The listener's intake (the dispatcher's `receive`): receive a message (if one comes within
        `timeout_millis`) and tell the feed: the message if the engine lets it go at once (the dispatcher delivers it
        next); else its deliveries reach the dispatcher's inbox through the feed."""
        try:
            raw = self._raw.receive(timeout_millis)
        except pulsar.Timeout:
            return None
        except pulsar.AlreadyClosed:
            if not self._closed.is_set():
                self._subscribed.wait(1)
            return None
        try:
            if MARKER_PROPERTY in raw.properties():
                self._marker(raw)
                return None
            message, key, _lane = self._wrap(raw)
            return message if self._feed.received(self._partition_of(key), key, message) else None
        except Exception:
            if self._closed.is_set():  # closed meanwhile (e.g. acknowledging a marker): the broker redelivers it
                log.debug("message %s of %s arrived while closing", raw.message_id(), self.topic, exc_info=True)
            else:
                log.exception("handling message %s of %s failed", raw.message_id(), self.topic)
            return None

    def pause_message_listener(self) -> None:
        """Receive nothing more for the listener until `resume_message_listener` (what was received before,
        and watermarks, still go to it). The consumer's own: its thread receives, not the client's listener."""
        if self._dispatcher is not None:
            self._dispatcher.pause()

    def resume_message_listener(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.resume()

    # -- pass-through --------------------------------------------------------------------------------

    def acknowledge(self, message: Any) -> None:
        """Acknowledge a message or message id; held back while it would let the subscription pass a
        position it moved back to before the watermark recomputed there has arrived (then sent)."""
        try:
            key, raw = message._wm_at, message._message  # a message `receive` returned: its message id, the lanes' key
            lane = self._only_lane or message._wm_lane
        except AttributeError:  # a message id, or a message this consumer did not return: by its position
            raw = None
            partition, position = self._position(message)
            key, lane = _message_id_at(position), self._lanes.get(partition)  # a key of the lanes' kind
            if lane is None:
                self._feed.report(Acknowledged(partition, position, functools.partial(self._send_acknowledgement,
                                                                                      message)))  # fmt: skip
                return
        if lane is None:  # received from a partition the engine did not follow yet
            partition = self._partition_of(key)
        else:  # the lane's protocol (consumer/trust.py `Lane`): append, then look
            acked = lane.acked
            acked.append(key)
            if lane.acknowledging and lane.acked is acked:
                if raw is not None:  # `_send_acknowledgement`, inline
                    acknowledge = self._raw_acknowledge  # (a local: see `receive`)
                    try:
                        acknowledge(raw)
                        return
                    except pulsar.AlreadyClosed:  # a seek is replacing the consumer (`_renew`)
                        pass
                self._send_acknowledgement(message)  # a method: a lambda here puts `message` in a cell per call
                return
            partition = lane.partition
        send = functools.partial(self._send_acknowledgement, message)
        self._feed.report(Acknowledged(partition, position_of(key), send))

    def _send_acknowledgement(self, message: Any) -> None:
        """Acknowledge a message or message id on the current Pulsar consumer: the one home of sending one (the feed's
        `acknowledge`: a marker, a seek's target; an acknowledgement the engine held, then released). `acknowledge`
        writes its first lines inline for the hot path."""
        if type(message) is _Message:  # the binding's own call
            try:
                self._raw.acknowledge(message._message)
                return
            except pulsar.AlreadyClosed:
                pass
        self._on_consumer(lambda c: c.acknowledge(message))

    def acknowledge_cumulative(self, message: Any) -> None:
        partition, position = self._position(message)
        send = lambda: self._on_consumer(lambda c: c.acknowledge_cumulative(message))  # noqa: E731
        self._feed.report(Acknowledged(partition, position, send, cumulative=True))

    def negative_acknowledge(self, message: Any) -> None:
        self._feed.report(NegativelyAcknowledged(*self._position(message)))
        self._on_consumer(lambda c: c.negative_acknowledge(message))

    def _on_raw(self, action: Callable[[Any], T]) -> T:
        """`_on_consumer` on the client's binding (`pulsar.Consumer._consumer`)."""
        return self._on_consumer(lambda c: action(c._consumer))

    def _attach(self, consumer: pulsar.Consumer) -> None:
        """Take `consumer` (from `subscribe`) as the one every call goes to."""
        self._consumer = consumer
        self._raw = consumer._consumer
        self._raw_receive, self._raw_acknowledge = self._raw.receive, self._raw.acknowledge
        """The binding's two calls of the pull path, bound once (a look-up of a binding's method per call costs about
        as much as a third of the call)."""
        self._accessors: tuple[Callable[[Any], Any], ...] = (
            _UNBOUND_ACCESSORS if type(self._raw) is _pulsar.Consumer else _CALLED_ACCESSORS
        )
        """What the pull path asks of each message (`properties`, `message_id`, `event_timestamp`), called with it."""
        self._schema = consumer._schema

    def _on_consumer(self, action: Callable[[pulsar.Consumer], T]) -> T:
        """`action(consumer)` on the current Pulsar consumer; once more on its successor if a seek replaced it
        meanwhile (`_renew`)."""
        self._subscribed.wait()
        consumer = self._consumer
        try:
            return action(consumer)
        except pulsar.AlreadyClosed:
            self._subscribed.wait()
            if self._closed.is_set() or self._consumer is consumer:
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
        partitions: tuple[int, ...] | None
        if isinstance(target, int) and not isinstance(target, bool):
            partitions, entry, skips = None, None, False
        else:
            index = target.partition()
            one = index >= 0 or len(self._feed.partitions) == 1
            partitions = (self._feed.partition_of(index),) if one else None
            entry, skips = (target.ledger_id(), target.entry_id()), self._skips_target(target)
        # With a listener nothing is received in between: what is queued now came before the seek.
        stopped = self._dispatcher.receiving_stopped() if self._dispatcher is not None else contextlib.nullcontext()
        with stopped:
            self._feed.report(Sought(partitions, entry, skips))  # sends the acknowledgements held first
            self._drop_queued(partitions)
            self._consumer.seek(target)
            if entry is not None and partitions is not None:
                self._renew()

    def _renew(self) -> None:
        """Close the Pulsar consumer and subscribe again, so that no start message id stays behind (see `seek`).

        Closing sends the acknowledgements it still groups; meanwhile acknowledgements (`_on_consumer`) wait
        for the new consumer, and the listener's thread receives nothing (`seek` stops its receiving).
        """
        self._subscribed.clear()
        try:
            with contextlib.suppress(pulsar.PulsarException):
                self._consumer.close()
            with explained(service_url=service_url_of(self._client), topic=self.topic, doing="subscribe again to"):
                self._attach(self._subscribe())
        finally:
            self._subscribed.set()

    def _skips_target(self, target: Any) -> bool:
        """Whether Pulsar resumes after `target` without acknowledging it (a real, unbatched message id)."""
        if self._inclusive_seek or target.batch_index() >= 0:
            return False
        ledger, entry = target.ledger_id(), target.entry_id()
        return ledger >= 0 and entry >= 0 and (ledger, entry) != (pulsar.MessageId.latest.ledger_id(),
                                                                   pulsar.MessageId.latest.entry_id())  # fmt: skip

    def _drop_queued(self, partitions: tuple[int, ...] | None) -> None:
        """Forget the deliveries of these partitions (None: all) waiting for the listener."""
        if self._dispatcher is not None:
            self._dispatcher.drop(lambda token: partitions is None or self._position(token)[0] in partitions)

    # The rest of `pulsar.Consumer`'s API is the underlying consumer's. Written out, not a `__getattr__`: a class
    # with one makes every attribute read on its instances the slow, unspecialized kind (a fifth of the pull
    # path's own cost, issue 48).

    def unsubscribe(self) -> None:
        self._consumer.unsubscribe()

    def get_last_message_id(self) -> pulsar.MessageId:
        return self._consumer.get_last_message_id()

    def redeliver_unacknowledged_messages(self) -> None:
        self._consumer.redeliver_unacknowledged_messages()

    def is_connected(self) -> bool:
        return bool(self._consumer.is_connected())

    def consumer_name(self) -> str:
        return str(self._consumer.consumer_name())

    def subscription_name(self) -> str:
        return str(self._consumer.subscription_name())

    def close(self) -> None:
        """Close the consumer; the watermark reader and the listener thread stop even if that fails.

        The error of the underlying close (e.g. the client was closed first) is raised after them.
        """
        if self._closed.is_set():
            return
        self._closed.set()
        self._warning.cancel()
        try:
            self._consumer.close()
        finally:
            self._feed.close()
            self._stop_dispatcher()

    def _stop_dispatcher(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.stop()

    def __enter__(self) -> WatermarkConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
