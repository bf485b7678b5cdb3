"""Where each cursor is, pushed by the broker plugin (broker_ext/plugin/): no admin call in steady state.

The plugin, loaded in every broker, keeps each followed topic's cursors (every durable subscription's
mark-delete position, the owner of `__wm_generator`, the last entry and the ledgers) and answers a long
poll with the topics that moved since the sequence number the caller knew. `PluginCursors` keeps one
such poll open per broker, on a thread of its own, and hands each move to the partition's engine as
the `CursorsPolled` an internal-stats read would have given: the engine does not know which it got.

It has the surface of `CursorPoller` (broker_ext/intake/admin_polling.py), which it wraps: a topic that no
plugin reports (a broker without the plugin, a broker that went away, a topic not loaded yet) is
followed by the poller's admin calls as before, and handed back once a plugin reports it. Brokers
are the admin URLs and, for a topic no plugin reports, its owner (one lookup). A broker's run is its
`epoch`: after a restart the plugin answers with everything it serves (`full`). Costs: docs/OPERATIONS.md.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from broker_ext.engine.vocabulary import CursorsPolled
from broker_ext.intake.admin_polling import CursorPoller
from broker_ext.intake.plugin_stream import intake_report
from broker_ext.intake.source import Followed, SnapshotDone
from broker_ext.loop import EventLoop
from pulsar_access.admin import AdminError, PluginMissing, PulsarAdmin
from watermark_core.protocol import GENERATOR_SUBSCRIPTION, INTERNAL_SUBSCRIPTIONS, position_of

log = logging.getLogger(__name__)

LONG_POLL_MS = 5_000
"""How long the plugin holds a poll without news (it holds no broker thread meanwhile); below the admin client's
10 s timeout."""
GATHER_S = 0.01
"""After an answer, the next poll waits this long: moves that come together (W_SETs acknowledged at each second's
start on many topics) then come in one answer, not one each (each costs both sides an HTTP round trip)."""
FOLLOW_BATCH = 500
"""Topics per follow request: each answer within the plugin's 30 s, even from a busy broker."""
ACK_GATHER_S = 1.0
"""The generator's cursor moves of this long go to a broker in one request. A move only lets retention drop what
a snapshot covers, so a second's delay costs nothing; a request per turn of the loop was a fifth of the
generator's Python CPU at 200 topics of one W_SET a second (docs/DECISIONS.md, session 27)."""
WRITE_GATHER_S = 0.5
"""How long snapshot records wait to go to a plugin together: a request per turn of the loop cost the generator about
0.05 ms per `W_SET` in the burst, where each topic's periodic snapshot comes due at its own time."""
RETRY_MAX_S = 5.0
_Item = TypeVar("_Item")
LOST_AFTER_S = 3.0
"""A broker that has not answered for this long: its topics go back to admin reads until a plugin reports them."""
LOOKUP_EVERY_S = 30.0
"""A topic no plugin reports is looked up (who serves it) at most this often."""
ABSENT_RETRY_S = 300.0
"""A broker that answered without the plugin is asked again this much later (it may be restarted with it)."""
GIVE_UP_AFTER_S = 120.0
"""A broker found by a lookup (not one of `--admin-url`'s) that has not answered for this long is polled no more
(removed from the cluster, or its address changed): its thread ends, and a later lookup naming it polls it again."""


@dataclass(frozen=True)
class Pushed:
    """One topic as a broker's plugin reported it last."""

    broker: str
    cursors: CursorsPolled
    owner: str | None
    incarnation: str | None
    """The topic property `wm.incarnation` (None: unset, or a plugin too old to report it)."""


def cursors_from(report: Mapping[str, Any]) -> tuple[CursorsPolled, str | None]:
    """A topic of the plugin's answer as the engine's `CursorsPolled`, and the owner of `__wm_generator`."""
    cursors = report["cursors"]
    generator = cursors.get(GENERATOR_SUBSCRIPTION) or (-1, -1)
    subscriptions = {name: (int(p[0]), int(p[1])) for name, p in cursors.items() if name not in INTERNAL_SUBSCRIPTIONS}
    return (
        CursorsPolled(
            subscriptions=subscriptions,
            generator_cursor=(int(generator[0]), int(generator[1])),
            last_confirmed=(int(report["lastConfirmed"][0]), int(report["lastConfirmed"][1])),
            ledgers=tuple((int(lid), int(entries)) for lid, entries in report["ledgers"]),
            created=int(report.get("created") or 0),
        ),
        report.get("owner"),
    )


class PluginCursors:
    """Cursor moves pushed by every broker's plugin; the wrapped poller for what no plugin reports."""

    def __init__(
        self, loop: EventLoop, admin: PulsarAdmin, poller: CursorPoller, pool: Executor,
        count: Callable[[str], None] = lambda call: None, fresh: Callable[[list[str]], None] = lambda topics: None,
        namespaces: Sequence[str] = (), intake: bool = False,
    ) -> None:  # fmt: skip
        self.intake = intake
        """Ask each plugin for the markers it finds (`--intake plugin`): handed to the partitions we own."""
        self.namespaces = tuple(namespaces)
        """Those followed: each plugin tells of their topics only (none: every topic it serves)."""
        self.fresh = fresh
        """Called with topics where a producer or consumer appeared and no generator follows yet (the service
        looks at its topic list at once, instead of at its next discovery)."""
        self.loop = loop
        self.admin = admin
        self.poller = poller
        self.pool = pool
        self._count = count
        self._followed: dict[str, Followed] = {}
        self._pushed: dict[str, Pushed] = {}
        """Topic -> what a plugin said of it last (loop thread)."""
        self._brokers: dict[str, threading.Thread] = {}
        self._absent: dict[str, float] = {}
        """Broker -> when it answered without the plugin (loop thread)."""
        self._looked_up: dict[str, float] = {}
        self._missed: dict[str, list[Mapping[str, Any]]] = {}
        """Topics whose intake a plugin told while they were not ours (loop thread): once one is, what the plugin
        keeps of it is asked for once more (`_refetch`), since what was told meanwhile does not come twice; what
        the polls tell of it until that answer comes is kept here, to be handed after it."""
        self._refetching: set[str] = set()
        """Brokers asked for everything they keep, the answer not in yet (loop thread)."""
        self._follows: dict[str, tuple[Followed, str]] = {}
        """Topic -> (partition, token offered) whose subscription a plugin is to make, sent at the end of the
        loop's turn (loop thread)."""
        self._acks: dict[str, dict[str, tuple[int, int]]] = {}
        """Broker -> topic -> where its generator cursor moves, sent `ack_gather_s` after the first (loop thread)."""
        self._writes: dict[str, dict[str, tuple[str, bytes, SnapshotDone]]] = {}
        """Broker -> topic -> (producer name, payload, answer) of a snapshot record its plugin is to write, sent
        `write_gather_s` after the first (loop thread)."""
        self.ack_gather_s, self.write_gather_s = ACK_GATHER_S, WRITE_GATHER_S
        self._writes_refused: set[str] = set()
        """Brokers whose plugin does not write snapshots (an older one, or the role may not): producers do there."""
        self._stopping = threading.Event()
        self._said_path = False

    # -- the surface partitions and the service use (loop thread, but start/close) ----------------------

    def start(self) -> None:
        self.poller.start()
        for base in self.admin.admin_bases:
            self._follow_broker(base)

    def close(self) -> None:
        self._stopping.set()
        self.poller.close()

    def add(self, partition: Followed) -> None:
        self._followed[partition.topic] = partition
        self.poller.add(partition)

    def remove(self, partition: Followed) -> None:
        self._followed.pop(partition.topic, None)
        self._looked_up.pop(partition.topic, None)
        self._missed.pop(partition.topic, None)
        self.poller.remove(partition)

    def owned(self, partition: Followed) -> None:
        if partition.topic in self._pushed:
            self.request(partition)
        else:
            self.poller.owned(partition)
            self._look_up(partition)

    def after(self, partition: Followed, marker_read: bool) -> None:
        if partition.topic not in self._pushed:
            self.poller.after(partition, marker_read)

    def reports(self, partition: Followed) -> bool:
        return partition.topic in self._pushed

    def incarnation(self, partition: Followed) -> str | None:
        pushed = self._pushed.get(partition.topic)
        return None if pushed is None else pushed.incarnation

    def served_by(self, partition: Followed) -> str | None:
        pushed = self._pushed.get(partition.topic)
        return None if pushed is None else pushed.broker

    def claimed(self, partition: Followed) -> bool:
        pushed = self._pushed.get(partition.topic)
        if pushed is None or not self.intake:
            return False
        self._missed.setdefault(partition.topic, [])  # what the plugin told before is not ours: ask for all it keeps
        self._refetch(pushed.broker)
        return True

    def request(self, partition: Followed) -> None:
        if partition.topic not in self._pushed:
            self.poller.request(partition)
            return
        self.loop.post(lambda: self._deliver_latest(partition))

    def acknowledge(self, partition: Followed, position: tuple[int, int]) -> bool:
        """Move the partition's `__wm_generator` cursor to `position` inside the broker whose plugin reports it
        (docs/PROTOCOL.md section 10); False where none does (its consumer acknowledges)."""
        pushed = self._pushed.get(partition.topic)
        if pushed is None:
            return False
        batch = self._gathering(self._acks, pushed.broker, self.ack_gather_s, "plugin-acks", self._send_acks)
        batch[partition.topic] = max(position, batch.get(partition.topic, position))
        return True

    def write_snapshot(self, partition: Followed, producer: str, payload: bytes, done: SnapshotDone) -> bool:
        """Have the plugin of the broker that reports the partition write a `W_SNAPSHOT` record into it under the
        producer name `producer` (docs/PROTOCOL.md section 10, "Writing snapshots"); `done(position, None)` or
        `done(None, why)` on the loop thread. False where no plugin can (the partition's producer writes it)."""
        pushed = self._pushed.get(partition.topic)
        if pushed is None or pushed.broker in self._writes_refused:
            return False
        batch = self._gathering(self._writes, pushed.broker, self.write_gather_s, "plugin-writes", self._send_writes)
        batch[partition.topic] = (producer, payload, done)  # the engine has one record of a partition in flight
        return True

    def _gathering(
        self, batches: dict[str, dict[str, _Item]], broker: str, gather_s: float, kind: str, send: Callable[[str], None]
    ) -> dict[str, _Item]:
        """The broker's batch of `kind`, sent (`send(broker)`) `gather_s` after its first item: one request for all
        that came meanwhile."""
        batch = batches.get(broker)
        if batch is None:
            batch = batches[broker] = {}
            self.loop.call_at(time.time() + gather_s, (kind, broker), functools.partial(send, broker))
        return batch

    def _send_writes(self, broker: str) -> None:
        batch = self._writes.pop(broker, None)
        if not batch:
            return

        def work() -> None:
            records = {topic: (producer, payload) for topic, (producer, payload, _) in batch.items()}
            try:
                outcomes = self.admin.plugin_write_snapshots(broker, records)
            except PluginMissing as exc:
                self.loop.post(lambda: self._writes_refused.add(broker))
                log.warning("the plugin on %s does not write snapshots (%s): the generator's producers write them "
                            "there", broker, exc)  # fmt: skip
                outcomes = {topic: f"failed: {exc}" for topic in batch}
            except AdminError as exc:
                outcomes = {topic: f"failed: {exc}" for topic in batch}
            else:
                self._count("plugin-snapshots")
            self.loop.post(lambda: self._answer_writes(batch, outcomes))

        self.pool.submit(work)

    @staticmethod
    def _answer_writes(batch: Mapping[str, tuple[str, bytes, SnapshotDone]], outcomes: Mapping[str, str]) -> None:
        for topic, (_, _, done) in batch.items():
            outcome = outcomes.get(topic, "failed: not in the plugin's answer")
            fields = outcome.split()
            if len(fields) == 3 and fields[0] == "written":
                done(position_of(int(fields[1]), int(fields[2]), -1), None)
            else:
                done(None, outcome)

    def follow(self, partition: Followed, token: str) -> bool:
        """Have a plugin make the partition's `__wm_generator` subscription and set its incarnation property to
        `token` where unset (docs/PROTOCOL.md section 10, "Following a topic"); answered by `partition.followed`.
        The partitions of a turn of the loop go in one request to each broker polled, as no one knows yet which
        serves them. False where no plugin is polled (the admin API makes it)."""
        if not self._brokers:
            return False
        if not self._follows:
            self.loop.post(self._send_follows)  # after this turn: one request per broker for all of it
        self._follows[partition.topic] = (partition, token)
        return True

    def _send_follows(self) -> None:
        batch, self._follows = self._follows, {}
        brokers, items = list(self._brokers), list(batch.items())
        for start in range(0, len(items), FOLLOW_BATCH):
            chunk = dict(items[start : start + FOLLOW_BATCH])
            self.pool.submit(functools.partial(self._follow_chunk, brokers, chunk))

    def _follow_chunk(self, brokers: list[str], chunk: dict[str, tuple[Followed, str]]) -> None:
        """On the pool: ask each broker's plugin in turn for what the ones before did not serve. Every partition is
        answered, whatever happens: one left unanswered would wait for its subscription forever."""
        found: dict[str, str] = {}
        try:
            self._ask_follow(brokers, chunk, found)
        finally:
            self.loop.post(lambda: self._answer_follows(chunk, found))

    def _ask_follow(self, brokers: list[str], chunk: dict[str, tuple[Followed, str]], found: dict[str, str]) -> None:
        for broker in brokers:
            wanted = {topic: token for topic, (_, token) in chunk.items() if topic not in found}
            if not wanted:
                break
            asked = time.monotonic()
            try:
                answer = self.admin.plugin_follow(broker, wanted)
            except AdminError as exc:  # a plugin older than this request too: the admin API makes them
                log.debug("following %d topics through the plugin on %s failed: %s", len(wanted), broker, exc)
                continue
            self._count("plugin-follow")
            took = time.monotonic() - asked
            log.log(logging.INFO if took > 1.0 else logging.DEBUG,
                    "the plugin on %s made the generator's subscription of %d of %d topics in %.1f s", broker,
                    len(answer.incarnations), len(wanted), took)  # fmt: skip
            found.update(answer.incarnations)
            for topic, why in answer.failed.items():
                log.debug("%s: the plugin on %s could not follow it: %s", topic, broker, why)

    @staticmethod
    def _answer_follows(batch: Mapping[str, tuple[Followed, str]], found: Mapping[str, str]) -> None:
        for topic, (partition, _) in batch.items():
            if not partition.closed:
                partition.followed(found.get(topic))

    def _send_acks(self, broker: str) -> None:
        batch = self._acks.pop(broker, None)
        if not batch:
            return

        def work() -> None:
            try:
                outcomes = self.admin.plugin_acknowledge(broker, batch)
            except AdminError as exc:  # the next snapshot moves it further; retention keeps what it covers
                log.debug("moving the generator's cursor of %d topics on %s failed: %s", len(batch), broker, exc)
                return
            self._count("plugin-acknowledge")
            for topic, outcome in outcomes.items():
                if outcome != "done":
                    log.debug("%s: moving the generator's cursor to %s on %s: %s", topic, batch[topic], broker, outcome)

        self.pool.submit(work)

    # -- answers (loop thread) ------------------------------------------------------------------------------

    def _deliver_latest(self, partition: Followed) -> None:
        """What a plugin said last when this runs, not when it was asked for: an answer queued in between is newer,
        and handing the older copy after it would move subscriptions back (the plugin pushes only real moves)."""
        if partition.closed:
            return
        pushed = self._pushed.get(partition.topic)
        if pushed is None:
            self.poller.request(partition)  # no plugin reports it since the request: the admin API answers
        else:
            self._deliver(partition, pushed)

    def _deliver(self, partition: Followed, pushed: Pushed) -> None:
        if pushed.owner is not None and not partition.ours(pushed.owner) and partition.owner:
            partition.lost(pushed.owner)
        else:
            partition.cursors(pushed.cursors)

    def _answered(self, broker: str, answer: Mapping[str, Any]) -> None:
        self._absent.pop(broker, None)
        if not self._said_path:
            self._said_path = True
            log.info("cursor positions come from the broker plugin watermark-cursors (first answer from %s): no "
                     "admin call per topic in steady state", broker)  # fmt: skip
        reported = answer.get("topics") or {}
        if answer.get("full"):
            self._forget(broker, [t for t, p in self._pushed.items() if p.broker == broker and t not in reported])
        self._forget(broker, answer.get("gone") or [])
        fresh = [topic for topic in answer.get("new") or [] if topic not in self._followed]
        if fresh:
            self.fresh(fresh)
        for topic, report in reported.items():
            polled, owner = cursors_from(report)
            pushed = Pushed(broker, polled, owner, report.get("incarnation"))
            self._pushed[topic] = pushed
            partition = self._followed.get(topic)
            found = report.get("intake")
            if partition is None or partition.closed:
                if found is not None:
                    self._missed[topic] = []
                continue
            self.poller.pushed(partition, True)
            if found is not None and self._hand_intake(broker, partition, owner, found, polled):
                continue  # the cursors went with the findings, as one event
            if partition.owner or partition.wants_cursors:
                self._deliver(partition, pushed)
            elif owner == partition.consumer_name:
                partition.named_owner(polled)  # the broker chose us; it delivers a second later

    def _hand_intake(
        self, broker: str, partition: Followed, owner: str | None, found: Mapping[str, Any], cursors: CursorsPolled
    ) -> bool:
        """What the plugin found, to the partition if it is ours, with the answer's cursors after it (its first entry
        makes the engine the owner); True when the cursors went with it. Each item is told once, so a partition
        that missed some gets all kept (`_refetch`) before anything else: handed first, this answer's `scannedTo`
        would pass the missed entries over as read."""
        if not partition.ours(owner):
            self._missed[partition.topic] = []
            return False
        kept = self._missed.get(partition.topic)
        if kept is not None:
            kept.append(found)
            self._refetch(broker)
            return False
        return self._hand(partition, found, cursors)

    def _hand(self, partition: Followed, found: Mapping[str, Any], cursors: CursorsPolled | None = None) -> bool:
        try:
            return partition.intake(intake_report(found), cursors)
        except ValueError as exc:
            log.warning("%s: %s", partition.topic, exc)
            return False

    def _refetch(self, broker: str) -> None:
        """Ask the broker's plugin for everything it keeps (a full answer, beside the long poll), for the topics
        that missed what it told; asked again while it fails."""
        if broker in self._refetching or self._stopping.is_set():
            return  # one at a time: what misses items after it was asked for is asked for when it comes
        self._refetching.add(broker)
        missing = set(self._waiting(broker))  # an answer serves only partitions ours (and missing) when asked for

        def work() -> None:
            try:
                answer = self.admin.plugin_changes(broker, "", -1, 0, self.namespaces, intake=True)
            except AdminError as exc:
                log.debug("asking %s for everything its plugin keeps failed: %s", broker, exc)
                answer = None
            self.loop.post(lambda: self._refetched(broker, answer, missing))

        self.pool.submit(work)

    def _refetched(self, broker: str, answer: Mapping[str, Any] | None, missing: set[str]) -> None:
        self._refetching.discard(broker)
        if answer is None:
            self._refetch_later(broker)
            return
        reported = answer.get("topics") or {}
        for topic in [t for t in missing if t in self._missed and (p := self._pushed.get(t)) and p.broker == broker]:
            partition = self._followed.get(topic)
            report = reported.get(topic)
            found = None if report is None else report.get("intake")
            if partition is None or partition.closed or report is None or found is None:
                continue
            if not partition.ours(report.get("owner")):
                continue  # not ours (any more), or not told here: a later poll tells it
            kept = self._missed.pop(topic)
            for told in (found, *kept):  # everything kept, then what the polls told meanwhile (the engine skips
                self._hand(partition, told)  # what it has)
        if any(t not in missing for t in self._waiting(broker)):
            self._refetch(broker)  # partitions that became ours after that request left
        else:
            self._refetch_later(broker)

    def _waiting(self, broker: str) -> list[str]:
        """Partitions of ours on this broker that still miss what its plugin told."""
        return [
            t for t in self._missed
            if (p := self._pushed.get(t)) is not None and p.broker == broker
            and (f := self._followed.get(t)) is not None and f.ours(p.owner)
        ]  # fmt: skip

    def _refetch_later(self, broker: str) -> None:
        """Ask again in a while where partitions of ours still miss what was told (the request failed, or the
        plugin had not read them yet)."""
        if self._waiting(broker):
            again = time.time() + RETRY_MAX_S / 5
            self.loop.call_at(again, ("plugin-refetch", broker), lambda: self._refetch(broker))

    def _forget(self, broker: str, topics: list[str]) -> None:
        """The broker no longer serves these topics (moved, unloaded, deleted, or it went away): admin reads
        follow them until a plugin reports them again."""
        for topic in topics:
            pushed = self._pushed.get(topic)
            if pushed is None or pushed.broker != broker:
                continue  # another broker reports it since
            del self._pushed[topic]
            partition = self._followed.get(topic)
            if partition is not None and not partition.closed:
                self.poller.pushed(partition, False)
                if self.intake:
                    partition.intake(None)  # no plugin finds its markers now: the consumer receives them
                if partition.owner:
                    self.poller.owned(partition)
                    self.poller.request(partition)
                    self._look_up(partition)

    def _lost_broker(self, broker: str) -> None:
        self._forget(broker, [t for t, p in self._pushed.items() if p.broker == broker])

    def _broker_gone(self, broker: str) -> None:
        self._brokers.pop(broker, None)
        self._lost_broker(broker)

    def _plugin_missing(self, broker: str, reason: str) -> None:
        first = not self._absent
        self._absent[broker] = time.monotonic()
        self._brokers.pop(broker, None)
        if first:
            log.warning("the broker at %s does not serve the plugin watermark-cursors (%s): the generator reads "
                        "cursor positions there through the admin API, one internal-stats call per topic and "
                        "acknowledgement (docs/OPERATIONS.md: installing the plugin)", broker, reason)  # fmt: skip
        self._lost_broker(broker)

    # -- brokers --------------------------------------------------------------------------------------------

    def _look_up(self, partition: Followed) -> None:
        """Which broker serves a topic no plugin reports: poll that broker's plugin too."""
        now = time.monotonic()
        if now - self._looked_up.get(partition.topic, -LOOKUP_EVERY_S) < LOOKUP_EVERY_S:
            return
        self._looked_up[partition.topic] = now

        def work() -> None:
            try:
                broker = self.admin.owner(partition.topic)
            except AdminError as exc:
                log.debug("looking up %s failed: %s", partition.topic, exc)
                return
            self.loop.post(lambda: self._follow_broker(broker.rstrip("/")))

        self.pool.submit(work)

    def _follow_broker(self, broker: str) -> None:
        if broker in self._brokers or self._stopping.is_set():
            return
        absent_at = self._absent.get(broker)
        if absent_at is not None and time.monotonic() - absent_at < ABSENT_RETRY_S:
            return
        thread = threading.Thread(target=self._poll_broker, args=(broker,), name=f"wm-plugin-{broker}", daemon=True)
        self._brokers[broker] = thread
        thread.start()

    def _poll_broker(self, broker: str) -> None:
        """One broker's long poll, on its own thread: answers go to the loop."""
        epoch, seq = "", -1
        retry_s, failing_since = 0.0, None
        while not self._stopping.is_set():
            try:
                answer = self.admin.plugin_changes(
                    broker,
                    epoch,
                    seq,
                    0 if seq < 0 or not epoch else LONG_POLL_MS,
                    self.namespaces,
                    intake=self.intake,
                )
            except PluginMissing as exc:
                self.loop.post(functools.partial(self._plugin_missing, broker, str(exc)))
                return
            except AdminError as exc:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.warning("the plugin of the broker at %s does not answer (%s); retrying", broker, exc)
                elif now - failing_since > GIVE_UP_AFTER_S and broker not in self.admin.admin_bases:
                    log.warning("the plugin of the broker at %s has not answered for %.0f s: no longer polling "
                                "it (a lookup that names it polls it again)", broker, now - failing_since)  # fmt: skip
                    self.loop.post(lambda: self._broker_gone(broker))
                    return
                elif now - failing_since > LOST_AFTER_S and epoch:
                    self.loop.post(lambda: self._lost_broker(broker))
                    epoch, seq = "", -1  # its topics are followed again from a full answer
                retry_s = min(max(retry_s * 2, 0.1), RETRY_MAX_S)
                self._stopping.wait(retry_s)
                continue
            if failing_since is not None:
                log.info("the plugin of the broker at %s answers again", broker)
            retry_s, failing_since = 0.0, None
            self._count("plugin")
            epoch, seq = str(answer["epoch"]), int(answer["seq"])
            self.loop.post(lambda answer=answer: self._answered(broker, answer))  # type: ignore[misc]
            self._stopping.wait(GATHER_S)
