"""Reads what the generator published about a data topic on its companion topic.

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

A companion topic may carry the events of a group of topics (issue 47). A consumer's feed reads it
through one reader per client and companion topic (`shared=True`), shared by every feed of that client
whose topic's events go there: the reader keeps the latest event of each key, so a feed that comes later
starts from those, as if it read the compacted topic now. The Spark source keeps every head event it reads,
not only the latest: the topics it starts following together share a reader of their own (`scope`), joined by
all of them before it reads anything.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

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
    head event about it, and only those about its current incarnation (`incarnations.holds`): on the caller's
    thread in `catch_up` (what was there), then on the reading thread once `start`ed. On the reading thread,
    `each_turn()` runs before every wait for the next event, and `on_caught_up(as_of)` when the reader has
    read everything published before monotonic time `as_of`: it asked (`has_message_available`, at most every
    `CAUGHT_UP_CHECK_S`, and only while `wants_caught_up()` says someone waits for it) and nothing more was
    there. Not "nothing came for a while": a busy companion topic (other subscriptions' tables every 50 ms) is
    never quiet, and the consumer waited for good (issue 34, fault 2). `subscription`: `on_table` gets only that
    subscription's events, and the others of a table are not decoded (a consumer's feed). `shared`: read through
    the client's one reader of the companion topic (`_CompanionThread`; the thread is named after the companion
    topic, not `thread_name`), or the one of `scope` (an object of the caller's: the readers that join it before
    any reads get everything from the topic's start).
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
        shared: bool = False,
        scope: object = None,
    ) -> None:
        self.topic = base_topic_and_partition(topic)[0]
        self._subscription = subscription
        self._incarnations = incarnations
        self._on_table, self._on_head = on_table, on_head
        self.each_turn, self.on_caught_up, self.wants_caught_up = each_turn, on_caught_up, wants_caught_up
        self.malformed_events = 0
        self.inbox: list[pulsar.Message] = []
        """What the reading thread read for it and it has not handled yet (under the thread's lock)."""
        self.started = False
        self.scope = scope
        """Held while the reader is: its `id` names the shared thread, and is not reused meanwhile."""
        name = thread_name or f"wm-companion-{self.topic}"
        self._thread = _CompanionThread.join(client, watermark_topic_for(topic), self, shared, name, scope)

    def catch_up(self) -> None:
        """Handle what is already there (read for at most `CATCH_UP_LIMIT_S`), on the caller's thread."""
        self._thread.read_what_is_there()
        if not self.started:
            for message in self._thread.take_inbox(self):
                self.handle(message)

    def start(self) -> None:
        """From now on the reading thread hands on what it reads, until `close`."""
        self.started = True
        self._thread.run()

    def handle(self, message: pulsar.Message) -> None:
        """One message read off the companion topic whose key names this reader's topic."""
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
        self._thread.leave(self)


@dataclass(eq=False)
class _CompanionThread:
    """One reader of a companion topic on its own thread, handing each `CompanionReader` that joined it the
    messages whose key names its topic."""

    client: pulsar.Client
    companion: str
    shared: bool
    thread_name: str
    reader: pulsar.Reader
    key: tuple[int, str, int]
    """Its place in the registry, when `shared`: the client, the companion topic and the scope."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    readers: dict[str, list[CompanionReader]] = field(default_factory=dict)
    """The joined readers, by topic (under `lock`)."""
    latest: dict[str, pulsar.Message] = field(default_factory=dict)
    """Shared: the latest message read per key, in the order read (what one that joins later starts from)."""
    reading: threading.Lock = field(default_factory=threading.Lock)
    """Held by whoever reads the reader: the thread, or a `catch_up` on its caller's thread."""
    delivering: threading.Lock = field(default_factory=threading.Lock)
    """Held by the thread while it hands the readers what it read: a reader that leaves takes it once, so that
    nothing reaches it after `close` returns."""
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    next_check: float = 0.0

    _registry: ClassVar[dict[tuple[int, str, int], _CompanionThread]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def join(
        cls,
        client: pulsar.Client,
        companion: str,
        joining: CompanionReader,
        shared: bool,
        thread_name: str,
        scope: object = None,
    ) -> _CompanionThread:
        """The thread `joining` reads through (when `shared`, the one for the companion topic of the client and
        `scope`)."""
        key = (id(client), companion, id(scope))
        with cls._registry_lock:
            reading = cls._registry.get(key) if shared else None
            if reading is None:
                with explained(service_url=service_url_of(client), topic=companion, doing="read the watermarks from"):
                    reader = client.create_reader(companion, pulsar.MessageId.earliest, is_read_compacted=True)
                name = f"wm-companion-{companion}" if shared else thread_name
                reading = cls(client, companion, shared, name, reader, key)
                if shared:
                    cls._registry[key] = reading
            with reading.lock:
                joined = reading.readers.setdefault(joining.topic, [])
                joined.append(joining)
                joining.inbox = [m for k, m in reading.latest.items() if key_topic(k) == joining.topic]
        return reading

    def run(self) -> None:
        """Start the reading thread (once)."""
        with self.lock:
            if self.thread is not None:
                return
            self.thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self.thread.start()

    def leave(self, leaving: CompanionReader) -> None:
        """`leaving` reads no more; the last to leave stops the thread and closes the reader."""
        with self._registry_lock:
            with self.lock:
                joined = self.readers.get(leaving.topic, [])
                if leaving in joined:
                    joined.remove(leaving)
                if not joined:
                    self.readers.pop(leaving.topic, None)
                last = not self.readers
            if last and self.shared and self._registry.get(self.key) is self:
                del self._registry[self.key]
        if last:
            self._close()
        elif threading.current_thread() is not self.thread and self.delivering.acquire(timeout=5):
            self.delivering.release()  # a turn that began before it left is over: nothing more reaches it

    def take_inbox(self, reader: CompanionReader) -> list[pulsar.Message]:
        with self.lock:
            messages, reader.inbox = reader.inbox, []
        return messages

    def _run(self) -> None:
        while not self.stop.is_set():
            self._turn()
            with self.reading:
                try:
                    self._take(self.reader.read_next(timeout_millis=READ_WAIT_MS))
                except pulsar.Timeout:
                    continue
                except pulsar.AlreadyClosed:
                    return
                except Exception:  # the reader reconnects by itself; keep following
                    if self.stop.is_set():
                        return
                    log.warning("reading the watermarks on %s failed; retrying", self.companion, exc_info=True)
                    failed = True
                else:
                    failed = False
            if failed:
                self.stop.wait(1)

    def read_what_is_there(self) -> None:
        """On the caller's thread (the reading thread waits meanwhile, at most `READ_WAIT_MS` for the caller): read
        what is published now, for at most `CATCH_UP_LIMIT_S`."""
        deadline = time.monotonic() + CATCH_UP_LIMIT_S
        with self.reading:
            try:
                while time.monotonic() < deadline and has_message_available(self.reader):
                    self._take(self.reader.read_next(timeout_millis=1000))
            except pulsar.PulsarException:  # a timeout, or no answer: the reading thread goes on from here
                log.debug("catching up with the watermarks on %s stopped early", self.companion, exc_info=True)

    def _take(self, message: pulsar.Message) -> None:
        key = message.partition_key()
        topic = key_topic(key)
        if topic is None:
            return  # a key of a generator before issue 47: not read
        with self.lock:
            if self.shared:
                self.latest.pop(key, None)  # in the order read: the latest of each key, after the others
                self.latest[key] = message
            for reader in self.readers.get(topic, ()):
                reader.inbox.append(message)

    def _started(self) -> list[CompanionReader]:
        with self.lock:
            return [reader for joined in self.readers.values() for reader in joined if reader.started]

    def _turn(self) -> None:
        """Hand the started readers what was read for them; each one's `each_turn`; tell whoever waits for it
        that everything published is read, when it is. Under `delivering`: one that leaves waits for it."""
        with self.delivering:
            self._deliver()

    def _deliver(self) -> None:
        started = self._started()
        for reader in started:
            for message in self.take_inbox(reader):
                reader.handle(message)
            if reader.each_turn is not None:
                reader.each_turn()
        asked = time.monotonic()
        if asked < self.next_check:
            return  # before asking the readers: `wants_caught_up` takes the feed's lock, which the pull path holds
        waiting = [
            reader for reader in started
            if reader.on_caught_up is not None and (reader.wants_caught_up is None or reader.wants_caught_up())
        ]  # fmt: skip
        if not waiting:
            return
        self.next_check = asked + CAUGHT_UP_CHECK_S
        try:
            with self.reading:  # not while a `catch_up` holds a message it read and has not taken yet
                available = has_message_available(self.reader)
        except Exception:  # no answer (reconnecting): not caught up; ask again next turn
            log.debug("asking the reader of %s for more failed", self.companion, exc_info=True)
            return
        if not available:
            for reader in waiting:
                for message in self.take_inbox(reader):  # read before `asked`: handled before it is told
                    reader.handle(message)
                assert reader.on_caught_up is not None
                reader.on_caught_up(asked)

    def _close(self) -> None:
        self.stop.set()
        thread = self.thread if self.thread is not threading.current_thread() else None
        if thread is not None:
            thread.join(timeout=2 * READ_WAIT_MS / 1000)  # it sees the stop within one read, normally
        with contextlib.suppress(pulsar.PulsarException):
            self.reader.close()  # wakes a read that outlasts its timeout (a loaded machine, a closed client)
        if thread is not None:
            thread.join(timeout=5)
