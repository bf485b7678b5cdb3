"""When to read which partition's cursors: the admin calls that follow markers, not partitions.

The engines need every subscription's mark-delete position (internal stats); reading them for
every partition all the time is what made the generator's cost grow with partitions. So:

- **Fast polls** follow markers. A marker read arms a partition's fast poll: its internal stats
  `first_poll_s` later (an acknowledgement shows at the broker after the client's acknowledgement
  grouping, 100 ms by default), or `poll_interval_s` after a cursor moved, backing off by 1.5x
  while nothing moves, until no marker waits for a subscription (`engine.wants_cursors`) or the
  interval passes `WATCH_AFTER_S` where the ack watch sees the topic, `idle_poll_interval_s`
  elsewhere; then the ack watch, or the sweep, takes over.
- **The ack watch** (broker_ext/intake/ack_watch.py) serves markers that wait for a late acknowledgement:
  while any does, the broker's `/metrics` once every `--ack-watch-interval-s` shows which
  subscriptions' mark-delete positions advanced; only those partitions get an internal-stats read.
  A partition whose last move came more than `LATE_S` after a marker read is *late*: its new markers
  go to the watch at once, without reads that would find nothing, but for one in `PROBE_EVERY`.
- **The sweep** is a cheap change detector over the topics this instance owns, one admin call per
  topic (one per partitioned topic: `partitioned-stats`), round-robin, at most `stats_rate` calls a
  second and each topic at most every `idle_poll_interval_s`. Per partition it reads the durable
  subscriptions, the active consumer of `__wm_generator` (ownership) and a fingerprint: messages in,
  and per subscription its backlog and `lastMarkDeleteAdvancedTimestamp`. Internal stats are read
  only where the fingerprint changed: an acknowledgement (the timestamp), a seek or reset (it does
  not touch the timestamp, but the backlog changes, in either direction, unless a publish of exactly
  as many entries hides it: then messages in changed), a new or removed subscription.
- **Sums first** for a partitioned topic: each sweep reads its stats summed over the partitions
  (messages in, and per subscription its backlog and messages dispatched) and reads every
  partition's stats only when that sum changed, or every `FULL_SWEEP_PERIODS` sweeps as a
  backstop (for changes that cancel out in the sum, e.g. one partition reset back by as many
  entries as another acknowledged with no consumer attached, and for ownership moves, which a sum
  does not show). Decoding a hundred partitions' stats every second was most of an idle
  generator's CPU.
- **Batching**: internal stats wanted for several partitions of one partitioned topic at once are
  read with one `partitioned-internalStats` call.

An idle partition thus costs one stats call per sweep period, `max(idle_poll_interval_s,
owned topics / stats_rate)` (a partitioned topic's partitions share one small call); that period is
also the bound on noticing a seek or a new subscription on a partition where no marker waits, and
`FULL_SWEEP_PERIODS` of them the bound on a lost ownership or a change the sum hides
(docs/DECISIONS.md).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from broker_ext.engine.vocabulary import CursorsPolled
from broker_ext.intake.ack_watch import AckWatch, mark_delete_times
from broker_ext.intake.source import Followed, SnapshotDone
from broker_ext.loop import EventLoop
from pulsar_access.admin import AdminError, PulsarAdmin, TopicNotFound, last_confirmed_entry, mark_delete_of
from watermark_core.protocol import GENERATOR_SUBSCRIPTION, INTERNAL_SUBSCRIPTIONS

log = logging.getLogger(__name__)

BACKOFF = 1.5
WATCH_AFTER_S = 0.25
"""Where the broker's metrics show the topic, its fast poll hands over to the ack watch beyond this interval."""
LATE_S = 2.0
"""A partition whose cursors were last found moved this long after a marker read acknowledges late (the watch
finds an acknowledgement within about a second: later than that, fast reads would have found nothing)."""
PROBE_EVERY = 4
"""On a partition that acknowledges late, one marker in this many still gets fast polls: it may be prompt again."""
FULL_SWEEP_PERIODS = 10
"""A partitioned topic's partitions are read one by one at least every this many sweeps of it."""
RETRY_MAX_S = 10.0
FAILURE_REPEAT_S = 60.0

Fingerprint = tuple[int, tuple[tuple[str, int, int], ...]]


@dataclass(frozen=True)
class Detected:
    """What the sweep reads of one partition's stats."""

    durable: frozenset[str]
    active: str | None
    """The active consumer of `__wm_generator` (None while there is none)."""
    fingerprint: Fingerprint


def detected(stats: Mapping[str, Any]) -> Detected:
    """The durable application subscriptions, the owner and the change fingerprint of a partition's stats."""
    subscriptions = stats.get("subscriptions") or {}
    durable = frozenset(
        name for name, sub in subscriptions.items() if sub.get("isDurable", True) and name not in INTERNAL_SUBSCRIPTIONS
    )
    ours = subscriptions.get(GENERATOR_SUBSCRIPTION) or {}
    fingerprint = (
        int(stats.get("msgInCounter", 0)),
        tuple(sorted(
            (name, int(sub.get("msgBacklog", 0)), int(sub.get("lastMarkDeleteAdvancedTimestamp", 0)))
            for name, sub in subscriptions.items() if name in durable
        )),
    )  # fmt: skip
    return Detected(durable, ours.get("activeConsumerName") or None, fingerprint)


def summed_fingerprint(stats: Mapping[str, Any]) -> Fingerprint:
    """What changes in a partitioned topic's summed stats when any partition's fingerprint changes, but for sums
    that cancel: messages in, and per application subscription its backlog and messages dispatched."""
    subscriptions = stats.get("subscriptions") or {}
    return (
        int(stats.get("msgInCounter", 0)),
        tuple(sorted(
            (name, int(sub.get("msgBacklog", 0)), int(sub.get("msgOutCounter", 0)))
            for name, sub in subscriptions.items() if name not in INTERNAL_SUBSCRIPTIONS
        )),
    )  # fmt: skip


def cursors_polled(internal: Mapping[str, Any], durable: frozenset[str]) -> CursorsPolled:
    """The engine's `CursorsPolled` from a partition's internal stats and its durable subscriptions.

    Internal stats list readers' non-durable cursors too: only the durable ones count.
    """
    cursors = internal.get("cursors") or {}
    return CursorsPolled(
        subscriptions={name: mark_delete_of(cursor) for name, cursor in cursors.items() if name in durable},
        generator_cursor=mark_delete_of(cursors.get(GENERATOR_SUBSCRIPTION) or {}),
        last_confirmed=last_confirmed_entry(dict(internal)),
        ledgers=tuple((int(info["ledgerId"]), int(info.get("entries", 0))) for info in internal.get("ledgers") or []),
    )


@dataclass
class PollState:
    """One partition's polling, kept by the poller (on the loop thread); nothing else reads it."""

    durable: frozenset[str] | None = None
    fingerprint: Fingerprint | None = None
    in_flight: bool = False
    again: bool = False
    fast_interval: float = 0.0
    """0: no fast poll; else the interval of the next one."""
    handed_over: bool = False
    """A marker still waits, but the fast poll backed off to the sweep; a marker read or a move re-arms it."""
    positions: Mapping[str, tuple[int, int]] | None = None
    retry_s: float = 0.0
    marker_read_at: float = 0.0
    """When the latest marker was read (time.time())."""
    late: bool = False
    """The last move was found more than `LATE_S` after the latest marker read: the subscriptions acknowledge late."""
    unprobed: int = 0
    """Markers read since the last one that got fast polls (a late partition gets them for one in `PROBE_EVERY`)."""
    pushed: bool = False
    """A broker's plugin reports this partition's moves (`CursorPoller.pushed`): no admin read, the sweep leaves it."""


class CursorPoller:
    """Schedules every admin call that reads cursors; runs them on `pool`, handles the answers on the loop."""

    def __init__(
        self, loop: EventLoop, admin: PulsarAdmin, pool: Executor, *, poll_interval_s: float,
        idle_poll_interval_s: float, stats_rate: float, count: Callable[[str], None] = lambda call: None,
        first_poll_s: float | None = None, ack_watch_interval_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.loop = loop
        self.admin = admin
        self.pool = pool
        self.poll_interval_s = poll_interval_s
        self.first_poll_s = poll_interval_s if first_poll_s is None else first_poll_s
        self.idle_poll_interval_s = idle_poll_interval_s
        self.stats_rate = stats_rate
        self._wanted: dict[str, Followed] = {}
        self._flush_posted = False
        self._failing_since: float | None = None
        self._last_failure_log = 0.0
        self._count = count
        self.states: dict[str, PollState] = {}
        """Topic -> its polling (loop thread)."""
        self.sweeper = Sweeper(
            admin, loop, count=count, changed=self._changed, failed=self._failure, swept=self._admin_reads,
            idle_poll_interval_s=idle_poll_interval_s, stats_rate=stats_rate,
        )  # fmt: skip
        self.watch = AckWatch(ack_watch_interval_s) if ack_watch_interval_s > 0 else None
        self._scraper = ThreadPoolExecutor(1, thread_name_prefix="wm-ack-watch") if self.watch is not None else None
        """Scrapes on a thread of their own: behind a queue of cursor reads they would come late."""
        self._followed: dict[str, Followed] = {}
        self._scraping = False
        self._watch_failure_logged = False

    # -- partitions (loop thread) -------------------------------------------------------------------

    def add(self, partition: Followed) -> None:
        self._followed[partition.topic] = partition
        self.states.setdefault(partition.topic, PollState())
        self.sweeper.add(partition)

    def remove(self, partition: Followed) -> None:
        self.loop.cancel((partition.topic, "poll"))
        self._wanted.pop(partition.topic, None)
        self._followed.pop(partition.topic, None)
        self.states.pop(partition.topic, None)
        if self.watch is not None:
            self.watch.forget(partition.topic)
        self.sweeper.remove(partition)

    def owned(self, partition: Followed) -> None:
        """The partition's engine owns it now: sweep its topic."""
        self.sweeper.owned(partition)

    def pushed(self, partition: Followed, pushed: bool) -> None:
        """Whether a broker's plugin reports the partition's moves (broker_ext/intake/plugin_cursors.py): while it
        does, no admin read is made for it and an admin read still under way is not handed over (it is older)."""
        self._state(partition).pushed = pushed

    def _state(self, partition: Followed) -> PollState:
        return self.states.get(partition.topic) or PollState()  # a removed partition's answer: thrown away

    def _admin_reads(self, partition: Followed) -> bool:
        """Whether the admin API follows this partition (no plugin reports it); asked by the sweep's thread."""
        state = self.states.get(partition.topic)
        return state is not None and not state.pushed

    def after(self, partition: Followed, marker_read: bool) -> None:
        """After an event other than a poll: a marker read (re)arms the fast poll; it stops once nothing waits."""
        state = self._state(partition)
        if marker_read:
            state.marker_read_at = time.time()
        if not partition.wants_cursors:
            self._stop_fast(partition)
        elif marker_read and state.late and self._watchable(partition) and state.unprobed < PROBE_EVERY - 1:
            state.unprobed += 1  # its subscriptions acknowledge late: reads would find nothing, the watch will tell
            state.handed_over = True
            self._watch(partition)
        elif marker_read or (not state.fast_interval and not state.handed_over):
            state.unprobed = 0
            self._arm(partition, self.first_poll_s)

    def _watchable(self, partition: Followed) -> bool:
        """Whether the ack watch can serve the partition: it runs, and the broker's metrics showed the topic."""
        return self.watch is not None and (self.watch.last_scrape is None or partition.topic in self.watch.seen)

    def _after_poll(self, partition: Followed, moved: bool) -> None:
        """After a poll: poll fast again while a marker waits, backing off while nothing moves."""
        state = self._state(partition)
        watched = self._watchable(partition)
        if moved and state.marker_read_at:
            state.late = time.time() - state.marker_read_at > LATE_S
        if not partition.wants_cursors:
            self._stop_fast(partition)
        elif moved and state.handed_over and watched:
            self._watch(partition)  # a late acknowledgement; the markers still waiting had their fast polls
        elif moved or (not state.fast_interval and not state.handed_over):
            self._arm(partition, self.poll_interval_s)
        elif state.fast_interval:
            interval = state.fast_interval * BACKOFF
            if interval <= (WATCH_AFTER_S if watched else self.idle_poll_interval_s):
                self._arm(partition, interval)
            else:
                state.fast_interval, state.handed_over = 0.0, True  # the ack watch or the sweep takes over
                if watched:
                    self._watch(partition)

    def _stop_fast(self, partition: Followed) -> None:
        state = self._state(partition)
        if state.fast_interval:
            self.loop.cancel((partition.topic, "poll"))
        state.fast_interval, state.handed_over = 0.0, False
        if self.watch is not None:
            self.watch.unwatch(partition.topic)

    # -- the ack watch: late acknowledgements from the broker's metrics (broker_ext/intake/ack_watch.py) ----

    def _watch(self, partition: Followed) -> None:
        assert self.watch is not None
        self.watch.watch(partition.topic)
        self._schedule_scrape()

    def _schedule_scrape(self) -> None:
        if self.watch is None or self._scraping:
            return
        when = self.watch.next_scrape(time.time())
        if when is None:
            self.loop.cancel("ack-watch")
        elif self.loop.scheduled("ack-watch") != when:
            self.loop.call_at(when, "ack-watch", self._scrape)

    def _scrape(self) -> None:
        """Read the brokers' metrics on the scrape thread: the mark-delete times of the followed topics they serve."""
        if self.watch is None or not self.watch.watched or self._scraping:
            return
        self._scraping = True
        followed = frozenset(self._followed)
        watched = list(self.watch.watched)

        def work() -> None:
            started = time.time()
            try:
                times: dict[str, dict[str, int]] = {}
                for body in self.admin.owners_metrics(watched):  # one read per broker that serves a watched topic
                    self._count("metrics")
                    times.update(mark_delete_times(body, followed.__contains__))
            except Exception as exc:  # whatever it is, the watch must not stay stuck in a scrape
                failure = exc if isinstance(exc, AdminError) else AdminError(f"{type(exc).__name__}: {exc}")
                self.loop.post(lambda: self._scrape_failed(started, failure))
                return
            self.loop.post(lambda: self._scraped(started, times))

        assert self._scraper is not None
        self._scraper.submit(work)

    def start(self) -> None:
        self.sweeper.start()

    def close(self) -> None:
        self.sweeper.stop()
        if self._scraper is not None:
            self._scraper.shutdown(wait=False, cancel_futures=True)

    def _scraped(self, started: float, times: dict[str, dict[str, int]]) -> None:
        assert self.watch is not None
        self._scraping = False
        if self._watch_failure_logged:
            log.info("reading the broker's metrics again: late acknowledgements are noticed within %.1f s",
                     self.watch.interval_s)  # fmt: skip
            self._watch_failure_logged = False
        for topic, subscriptions in times.items():  # only durable application subscriptions count
            partition = self._followed.get(topic)
            durable = self._state(partition).durable if partition is not None else None
            times[topic] = {
                name: at for name, at in subscriptions.items()
                if (name in durable if durable is not None else name not in INTERNAL_SUBSCRIPTIONS)
            }  # fmt: skip
        for topic in self.watch.scraped(started, times):
            partition = self._followed.get(topic)
            if partition is not None and not partition.closed and partition.wants_cursors:
                self.request(partition)
        self._schedule_scrape()

    def _scrape_failed(self, started: float, exc: AdminError) -> None:
        assert self.watch is not None
        self._scraping = False
        self.watch.failed(started)
        if not self._watch_failure_logged:
            self._watch_failure_logged = True
            log.warning("reading the broker's metrics failed (%s); late acknowledgements are noticed by the sweep "
                        "meanwhile (every owned topics / --stats-rate seconds). Let the generator read /metrics "
                        "(authenticateMetricsEndpoint=false or a role allowed to) or turn this off with "
                        "--ack-watch-interval-s 0", exc)  # fmt: skip
        self._schedule_scrape()

    def reports(self, partition: Followed) -> bool:
        return False  # no plugin here

    def claimed(self, partition: Followed) -> bool:
        return False

    def served_by(self, partition: Followed) -> str | None:
        return None

    def incarnation(self, partition: Followed) -> str | None:
        return None  # the admin API reads the property when asked

    def acknowledge(self, partition: Followed, position: tuple[int, int]) -> bool:
        return False  # through the admin API, the partition's consumer moves its cursor

    def write_snapshot(self, partition: Followed, producer: str, payload: bytes, done: SnapshotDone) -> bool:
        return False  # no plugin here: the partition's producer writes it

    def follow(self, partition: Followed, token: str) -> bool:
        return False  # no plugin here: the admin API makes the subscription

    def request(self, partition: Followed) -> None:
        """Read the partition's cursors as soon as possible (batched with others of its topic)."""
        state = self._state(partition)
        if state.pushed:
            return  # a plugin reports it (a fast poll armed before it did): its moves come pushed
        if state.in_flight:
            state.again = True
            return
        self._wanted[partition.topic] = partition
        if not self._flush_posted:
            self._flush_posted = True
            self.loop.post(self._flush)

    def _arm(self, partition: Followed, interval: float) -> None:
        state = self._state(partition)
        state.fast_interval, state.handed_over = interval, False
        key = (partition.topic, "poll")
        when = time.time() + interval
        scheduled = self.loop.scheduled(key)
        if scheduled is None or scheduled > when:
            self.loop.call_at(when, key, lambda: self.request(partition))

    # -- internal stats -----------------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_posted = False
        wanted, self._wanted = self._wanted, {}
        by_topic: dict[str, list[Followed]] = collections.defaultdict(list)
        for partition in wanted.values():
            state = self._state(partition)
            if partition.closed or state.pushed:
                continue
            state.in_flight = True
            by_topic[partition.base_topic].append(partition)
        for base_topic, partitions in by_topic.items():
            if len(partitions) > 1:
                self._submit(self._read_partitioned, base_topic, partitions)
            else:
                self._submit(self._read_one, base_topic, partitions)

    def _submit(
        self, read: Callable[[str, list[Followed]], dict[str, tuple[Mapping[str, Any], Mapping[str, Any] | None]]],
        base_topic: str, partitions: list[Followed],
    ) -> None:  # fmt: skip
        def work() -> None:
            try:
                answers = read(base_topic, partitions)
            except AdminError as exc:
                failure = exc
                self.loop.post(lambda: self._failed(partitions, failure))
                return
            self.loop.post(lambda: self._answered(partitions, answers))

        self.pool.submit(work)

    def _read_one(
        self, _base: str, partitions: list[Followed]
    ) -> dict[str, tuple[Mapping[str, Any], Mapping[str, Any] | None]]:
        (partition,) = partitions
        stats = None
        if self._state(partition).durable is None:
            self._count("stats")
            stats = self.admin.brief_stats(partition.topic)
        self._count("internalStats")
        return {partition.topic: (self.admin.fast_internal_stats(partition.topic), stats)}

    def _read_partitioned(
        self, base_topic: str, partitions: list[Followed]
    ) -> dict[str, tuple[Mapping[str, Any], Mapping[str, Any] | None]]:
        stats = None
        if any(self._state(p).durable is None for p in partitions):
            self._count("partitioned-stats")
            stats = self.admin.partitioned_brief_stats(base_topic)
        self._count("partitioned-internalStats")
        internal = self.admin.partitioned_internal_stats(base_topic)
        return {
            p.topic: (internal[p.topic], stats.get(p.topic) if stats is not None else None)
            for p in partitions if p.topic in internal
        }  # fmt: skip

    def _answered(
        self, partitions: list[Followed], answers: dict[str, tuple[Mapping[str, Any], Mapping[str, Any] | None]]
    ) -> None:
        self._recovered()
        for partition in partitions:
            state = self._state(partition)
            state.in_flight = False
            answer = answers.get(partition.topic)
            if partition.closed:
                continue
            if state.pushed:  # read before a plugin took the partition over: older than what it pushed since
                state.again = False
                continue
            if answer is None:  # left out of a partitioned answer: ask again later
                self._retry(partition)
                continue
            state.retry_s = 0.0
            internal, stats = answer
            if stats is not None:
                self._detected(partition, detected(stats), poll=False)
            if state.durable is None:
                self._retry(partition)
                continue
            polled = cursors_polled(internal, state.durable)
            moved = state.positions is not None and polled.subscriptions != state.positions
            state.positions = polled.subscriptions
            partition.cursors(polled)
            self._after_poll(partition, moved)
            if state.again:
                state.again = False
                self.request(partition)

    def _failed(self, partitions: list[Followed], exc: AdminError) -> None:
        self._failure(exc)
        for partition in partitions:
            self._state(partition).in_flight = False
            if isinstance(exc, TopicNotFound) or partition.closed:
                continue  # deleted: discovery drops it
            self._retry(partition)

    def _retry(self, partition: Followed) -> None:
        state = self._state(partition)
        state.retry_s = min(max(state.retry_s * 2, 0.5), RETRY_MAX_S)
        self.loop.call_at(time.time() + state.retry_s, (partition.topic, "poll"), lambda: self.request(partition))

    # -- what the sweep found (loop thread) ---------------------------------------------------------

    def _detected(self, partition: Followed, seen: Detected, *, poll: bool) -> None:
        state = self._state(partition)
        state.durable = seen.durable
        if seen.active is not None and seen.active != partition.consumer_name and partition.owner:
            partition.lost(seen.active)
        elif poll:
            self.request(partition)
        if not poll:
            self.sweeper.seen(partition.topic, seen.fingerprint)

    def _changed(self, changes: list[tuple[Followed, Detected]]) -> None:
        self._recovered()
        for partition, seen in changes:
            if not partition.closed:
                self._detected(partition, seen, poll=True)

    # -- failures -----------------------------------------------------------------------------------

    def _failure(self, exc: AdminError) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = self._last_failure_log = now
            log.warning("reading cursors failed: %s; retrying with a back-off up to %.0f s", exc, RETRY_MAX_S)
        elif now - self._last_failure_log >= FAILURE_REPEAT_S:
            self._last_failure_log = now
            log.warning("reading cursors still failing after %.0f s: %s", now - self._failing_since, exc)
        else:
            log.debug("reading cursors failed: %s", exc)

    def _recovered(self) -> None:
        if self._failing_since is not None:
            log.info("reading cursors again after %.0f s", time.monotonic() - self._failing_since)
            self._failing_since = None


class Sweeper:
    """The change detector, on a thread of its own: it wakes the loop only where a partition changed.

    Round-robin over the base topics with an owned partition; each at most every
    `idle_poll_interval_s`, and at most `stats_rate` calls a second overall. The fingerprints it
    compares live here (under a lock: a poll that read stats records its own).
    """

    def __init__(
        self, admin: PulsarAdmin, loop: EventLoop, *, count: Callable[[str], None],
        changed: Callable[[list[tuple[Followed, Detected]]], None], failed: Callable[[AdminError], None],
        swept: Callable[[Followed], bool], idle_poll_interval_s: float, stats_rate: float,
    ) -> None:  # fmt: skip
        self.admin = admin
        self.loop = loop
        self._count = count
        self._changed = changed
        """Told on the loop thread of the partitions whose stats changed."""
        self._failed = failed
        self._swept = swept
        """Whether a partition is for the sweep (the admin API follows it), asked on the sweep's thread."""
        self.idle_poll_interval_s = idle_poll_interval_s
        self.stats_rate = stats_rate
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._partitions: dict[str, dict[str, Followed]] = {}
        """Base topic -> partition topic -> partition."""
        self._round: collections.deque[str] = collections.deque()
        self._queued: set[str] = set()
        self._last: dict[str, float] = {}
        self._fingerprints: dict[str, Fingerprint] = {}
        self._sums: dict[str, tuple[Fingerprint, int]] = {}
        """Base topic -> its summed fingerprint at the last sweep, and sweeps since its partitions were read."""
        self._thread = threading.Thread(target=self._run, name="wm-sweep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    # -- from the loop thread -------------------------------------------------------------------------

    def add(self, partition: Followed) -> None:
        with self._lock:
            self._partitions.setdefault(partition.base_topic, {})[partition.topic] = partition

    def remove(self, partition: Followed) -> None:
        with self._lock:
            partitions = self._partitions.get(partition.base_topic)
            if partitions is not None:
                partitions.pop(partition.topic, None)
                if not partitions:
                    del self._partitions[partition.base_topic]
                    self._sums.pop(partition.base_topic, None)
            self._fingerprints.pop(partition.topic, None)

    def owned(self, partition: Followed) -> None:
        with self._lock:
            if partition.base_topic not in self._queued:
                self._queued.add(partition.base_topic)
                self._round.append(partition.base_topic)
        self._wake.set()

    def seen(self, topic: str, fingerprint: Fingerprint) -> None:
        with self._lock:
            self._fingerprints[topic] = fingerprint

    # -- on its own thread ----------------------------------------------------------------------------

    def _next(self) -> tuple[str, list[Followed]] | float:
        """The next topic to sweep and its owned partitions, or how long to wait."""
        now = time.monotonic()
        with self._lock:
            while self._round:
                base_topic = self._round[0]
                owned = [
                    p for p in self._partitions.get(base_topic, {}).values()
                    if p.owner and not p.closed and self._swept(p)
                ]  # fmt: skip
                if not owned:
                    self._round.popleft()
                    self._queued.discard(base_topic)
                    continue
                period = max(self.idle_poll_interval_s, len(self._round) / self.stats_rate)
                due = self._last.get(base_topic, 0.0) + period
                if due > now:
                    return due - now
                self._round.rotate(-1)
                self._last[base_topic] = now
                return base_topic, owned
        return 5.0

    def _run(self) -> None:
        while not self._stopping.is_set():
            step = self._next()
            if isinstance(step, float):
                self._wake.wait(step)
                self._wake.clear()
                continue
            base_topic, owned = step
            try:
                answers = self._read(base_topic, owned)
            except AdminError as exc:
                self.loop.post(functools.partial(self._failed, exc))
            except Exception:
                log.exception("sweeping %s failed", base_topic)
            else:
                self._compare(owned, answers)
            self._stopping.wait(1.0 / self.stats_rate)

    def _read(self, base_topic: str, owned: list[Followed]) -> Mapping[str, Mapping[str, Any]]:
        """Every owned partition's stats, or none where the partitioned topic's sums show nothing changed."""
        admin = self.admin
        if owned[0].partition >= 0:
            self._count("partitioned-stats-summed")
            if not self._partitions_wanted(base_topic, summed_fingerprint(admin.partitioned_summed_stats(base_topic)),
                                           owned):  # fmt: skip
                return {}
            self._count("partitioned-stats")
            return admin.partitioned_brief_stats(base_topic)
        self._count("stats")
        return {owned[0].topic: admin.brief_stats(owned[0].topic)}

    def _partitions_wanted(self, base_topic: str, summed: Fingerprint, owned: list[Followed]) -> bool:
        """Whether to read the partitions one by one: the sums changed, the backstop is due, or one is new."""
        with self._lock:
            before, sweeps = self._sums.get(base_topic, (None, FULL_SWEEP_PERIODS))
            wanted = (
                summed != before or sweeps + 1 >= FULL_SWEEP_PERIODS
                or any(p.topic not in self._fingerprints for p in owned)
            )  # fmt: skip
            self._sums[base_topic] = (summed, 0 if wanted else sweeps + 1)
        return wanted

    def _compare(self, owned: list[Followed], answers: Mapping[str, Mapping[str, Any]]) -> None:
        changes: list[tuple[Followed, Detected]] = []
        with self._lock:
            for partition in owned:
                stats = answers.get(partition.topic)
                if stats is None:
                    continue
                seen = detected(stats)
                before = self._fingerprints.get(partition.topic)
                self._fingerprints[partition.topic] = seen.fingerprint
                lost = seen.active is not None and seen.active != partition.consumer_name
                if lost or seen.fingerprint != before:
                    changes.append((partition, seen))
        if changes:
            self.loop.post(lambda: self._changed(changes))
