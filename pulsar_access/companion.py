"""Reads what the generator published about one data topic on its companion topic.

The generator publishes two kinds of events there (`watermark_topic_for`: in the watermark namespace,
where only the generator may produce): `SendWatermark` tables (each subscription's watermark at its
mark-delete position) and head events (the watermark at a position of a partition's log), on their own
or riding on a table. Compaction
keeps the latest of each per key, so reading the compacted topic from its start gives what holds now
at once, and reading on gives every change after it.

One home for that reading, shared by the consumer's feed (consumer/watermark_feed.py) and the Spark
source (spark_sink/watermarks.py): they say what to do with each event. An event whose key
(`table_key`, `head_key`) or body names another data topic is ignored (a companion topic may carry the
events of several), and so is one under a key of a generator before issue 47, and one about another
incarnation of the topic than the one it has now (`Incarnations`, pulsar_access/incarnations.py: a
topic deleted and created again keeps its companion, with the old topic's events on it); a malformed
one is skipped, counted and logged once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import pulsar

from pulsar_access.errors import explained, service_url_of
from pulsar_access.incarnations import Incarnations
from pulsar_access.readers import has_message_available
from pulsar_access.topics import base_topic_and_partition, watermark_topic_for
from watermark_core.protocol import (
    EVENT_PROPERTY,
    HEAD_WATERMARK,
    SEND_WATERMARK,
    HeadWatermark,
    MalformedMarker,
    WatermarkEvent,
    decode_head,
    decode_table_with_heads,
    key_topic,
)

log = logging.getLogger(__name__)

CATCH_UP_LIMIT_S = 10.0
"""How long `catch_up` reads what is already there, at most."""
READ_WAIT_MS = 200
"""How long the reading thread waits for the next event before its `each_turn` runs again."""
CAUGHT_UP_CHECK_S = 0.1
"""How often, at most, the reading thread asks whether it has read everything published (`on_caught_up`)."""


class CompanionReader:
    """`CompanionReader(client, topic, incarnations, on_table=..., on_head=...)`: `catch_up()`, then `start()`.

    `on_table(events)` gets the events of one `SendWatermark` table about `topic`, `on_head(head)` each
    head event about it, and only those about its current incarnation (`incarnations.holds`). On the
    reading thread, `each_turn()` runs before every wait for the next event, and `on_caught_up(as_of)` when the
    reader has read everything published before monotonic time `as_of`: it asked (`has_message_available`, at
    most every `CAUGHT_UP_CHECK_S`, and only while `wants_caught_up()` says someone waits for it) and nothing
    more was there. Not "nothing came for a while": a busy companion topic (other subscriptions' tables every
    50 ms) is never quiet, and the consumer waited for good (issue 34, fault 2). `subscription`: `on_table` gets
    only that subscription's events, and the others of a table are not decoded (a consumer's feed).
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        incarnations: Incarnations,
        *,
        on_table: Callable[[list[WatermarkEvent]], None],
        on_head: Callable[[HeadWatermark], None],
        each_turn: Callable[[], None] | None = None,
        on_caught_up: Callable[[float], None] | None = None,
        wants_caught_up: Callable[[], bool] | None = None,
        thread_name: str | None = None,
        subscription: str | None = None,
    ) -> None:
        self.topic = base_topic_and_partition(topic)[0]
        self._subscription = subscription
        self._incarnations = incarnations
        self._on_table, self._on_head = on_table, on_head
        self._each_turn, self._on_caught_up, self._wants_caught_up = each_turn, on_caught_up, wants_caught_up
        self._next_check = 0.0
        self._thread_name = thread_name or f"wm-companion-{self.topic}"
        self.malformed_events = 0
        companion = watermark_topic_for(topic)
        with explained(service_url=service_url_of(client), topic=companion, doing="read the watermarks from"):
            self._reader = client.create_reader(companion, pulsar.MessageId.earliest, is_read_compacted=True)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def catch_up(self) -> None:
        """Read what is already there (for at most `CATCH_UP_LIMIT_S`), on the caller's thread."""
        deadline = time.monotonic() + CATCH_UP_LIMIT_S
        try:
            while time.monotonic() < deadline and has_message_available(self._reader):
                self._handle(self._reader.read_next(timeout_millis=1000))
        except pulsar.PulsarException:  # a timeout, or no answer: the reading thread goes on from here
            log.debug("catching up with the watermarks of %s stopped early", self.topic, exc_info=True)

    def start(self) -> None:
        """Read on, on a thread of its own, until `close`."""
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._each_turn is not None:
                self._each_turn()
            if self._on_caught_up is not None:
                self._check_caught_up(self._on_caught_up)
            try:
                message = self._reader.read_next(timeout_millis=READ_WAIT_MS)
            except pulsar.Timeout:
                continue
            except pulsar.AlreadyClosed:
                return
            except Exception:  # the reader reconnects by itself; keep following
                if self._stop.is_set():
                    return
                log.warning("reading the watermarks of %s failed; retrying", self.topic, exc_info=True)
                time.sleep(1)
                continue
            self._handle(message)

    def _check_caught_up(self, on_caught_up: Callable[[float], None]) -> None:
        """`on_caught_up(asked)` if nothing more is available now (a call to the broker when the reader is at
        the end: asked only when someone waits, and not more often than `CAUGHT_UP_CHECK_S`)."""
        asked = time.monotonic()
        if asked < self._next_check or (self._wants_caught_up is not None and not self._wants_caught_up()):
            return
        self._next_check = asked + CAUGHT_UP_CHECK_S
        try:
            available = has_message_available(self._reader)
        except Exception:  # no answer (reconnecting): not caught up; ask again next turn
            log.debug("asking the reader of %s for more failed", self.topic, exc_info=True)
            return
        if not available:
            on_caught_up(asked)

    def _handle(self, message: pulsar.Message) -> None:
        if key_topic(message.partition_key()) != self.topic:
            return  # another topic's event on a shared companion topic, or an older generator's: not decoded
        kind = message.properties().get(EVENT_PROPERTY)
        try:
            if kind == HEAD_WATERMARK:
                head = decode_head(message.data())
                if head.topic == self.topic and self._holds(head.partition, head.incarnation):
                    self._on_head(head)
            elif kind == SEND_WATERMARK:
                table, heads = decode_table_with_heads(message.data(), self._subscription)
                for head in heads:
                    if head.topic == self.topic and self._holds(head.partition, head.incarnation):
                        self._on_head(head)
                events = [
                    event for event in table
                    if event.topic == self.topic and self._holds(event.partition, event.incarnation)
                ]  # fmt: skip
                if events:
                    self._on_table(events)
            else:
                raise MalformedMarker("bad-event", f"unknown watermark event kind {kind!r}")
        except MalformedMarker as exc:
            self.malformed_events += 1
            if self.malformed_events == 1:
                log.warning("skipping malformed watermark event at %s on %s: %s",
                            message.message_id(), message.topic_name(), exc)  # fmt: skip

    def _holds(self, partition: int, token: str | None) -> bool:
        return self._incarnations.holds(self.topic, partition, token)

    def close(self) -> None:
        self._stop.set()
        thread = self._thread if self._thread is not threading.current_thread() else None
        if thread is not None:
            thread.join(timeout=2 * READ_WAIT_MS / 1000)  # it sees the stop within one read, normally
        with contextlib.suppress(pulsar.PulsarException):
            self._reader.close()  # wakes a read that outlasts its timeout (a loaded machine, a closed client)
        if thread is not None:
            thread.join(timeout=5)
