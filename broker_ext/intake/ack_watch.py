"""Which subscriptions acknowledged lately, for many topics in one call: the broker's Prometheus metrics.

A marker that waits for a late acknowledgement is past its fast poll (broker_ext/intake/admin_polling.py); reading
its partition's internal stats every second until the acknowledgement comes would cost one admin call
per waiting topic per second, and the sweep (one call per topic, `--stats-rate` a second) reaches a
topic only every `topics / --stats-rate` seconds. The broker's `/metrics` lists, for every
subscription of every topic it serves, `pulsar_subscription_last_mark_delete_advanced_timestamp`:
one call per broker shows which subscriptions moved their mark-delete position since the call before.
Only those partitions get an internal-stats read, which is where positions come from: the metrics
never move a watermark, they only say where to look.

`AckWatch` is the pure part (the loop thread drives it; `now` is passed in); `mark_delete_times`
reads the metrics text. The cost: one scrape per `interval_s` while some marker waits past its
fast poll, of a size that grows with every topic the broker serves (about 13 KB each), and one
internal-stats read per subscription that moved.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

METRIC = b"\npulsar_subscription_last_mark_delete_advanced_timestamp{"
MAX_IDLE_BACKOFF = 32
"""When scrapes show none of the watched topics (served by another broker), they slow down to this many intervals."""

Times = Mapping[str, Mapping[str, int]]
"""Partition topic -> subscription -> the broker's last mark-delete advance (ms)."""


def mark_delete_times(body: bytes, wanted: Callable[[str], bool]) -> dict[str, dict[str, int]]:
    """Each subscription's `lastMarkDeleteAdvancedTimestamp` from a broker's Prometheus text, for topics `wanted`.

    A plain scan for the one metric (the text is megabytes; a regular expression over all of it is 5x slower).
    """
    times: dict[str, dict[str, int]] = {}
    start = body.find(METRIC)
    while start >= 0:
        labels_at = start + len(METRIC)
        end = body.find(b"\n", labels_at)
        line = body[labels_at : end if end >= 0 else len(body)]
        labels, _, sample = line.rpartition(b"} ")
        value = sample.split(b" ", 1)[0]  # a timestamp may follow the value
        topic = _label(labels, b'topic="')
        subscription = _label(labels, b'subscription="')
        if topic is not None and subscription is not None and wanted(topic):
            with contextlib.suppress(ValueError, OverflowError):  # not a number: as if absent
                times.setdefault(topic, {})[subscription] = int(float(value))
        start = body.find(METRIC, labels_at)
    return times


def _label(labels: bytes, key: bytes) -> str | None:
    at = labels.find(key)
    if at < 0 or (at > 0 and labels[at - 1 : at] != b","):
        return None
    at += len(key)
    end = labels.find(b'"', at)
    return labels[at:end].decode("utf-8", errors="replace") if end >= 0 else None


@dataclass
class AckWatch:
    """When to read the brokers' metrics, and which watched partitions to read the cursors of afterwards.

    Watched: partitions where a marker waits for an acknowledgement past the fast poll. A scrape is
    due `interval_s` after the one before while any is watched (none while none is); one whose
    subscriptions' mark-delete times differ from the previous scrape's (or that no scrape showed
    before) gets its cursors read. A topic the scrape does not show (served by another broker, or
    topic metrics off) is left to the sweep; scrapes that show no watched topic slow down.
    """

    interval_s: float
    watched: set[str] = field(default_factory=set)
    seen: dict[str, dict[str, int]] = field(default_factory=dict)
    last_scrape: float | None = None
    idle_scrapes: int = 0
    """Scrapes in a row that showed none of the watched topics."""

    def watch(self, topic: str) -> None:
        if topic not in self.watched:
            # what a scrape saw while nobody waited here is no baseline: an acknowledgement then may be the
            # one the marker waits for, so the first scrape after this reads the cursors
            self.seen.pop(topic, None)
            self.watched.add(topic)

    def unwatch(self, topic: str) -> None:
        self.watched.discard(topic)

    def forget(self, topic: str) -> None:
        """The partition is no longer followed."""
        self.watched.discard(topic)
        self.seen.pop(topic, None)

    def next_scrape(self, now: float) -> float | None:
        """When the next scrape is due (None: nothing is watched)."""
        if not self.watched:
            return None
        if self.last_scrape is None:
            return now
        backoff: int = min(2**self.idle_scrapes, MAX_IDLE_BACKOFF)
        return max(now, self.last_scrape + self.interval_s * backoff)

    def scraped(self, now: float, times: Times) -> list[str]:
        """A scrape's mark-delete times of the followed topics it shows: the watched partitions to read."""
        self.last_scrape = now
        moved = [
            topic for topic in sorted(self.watched)
            if topic in times and times[topic] != self.seen.get(topic)
        ]  # fmt: skip
        self.idle_scrapes = 0 if any(topic in times for topic in self.watched) else self.idle_scrapes + 1
        for topic, subscriptions in times.items():
            self.seen[topic] = dict(subscriptions)
        return moved

    def failed(self, now: float) -> None:
        """The scrape failed (refused, no such endpoint, broker away): try again later, slowly."""
        self.last_scrape = now
        self.idle_scrapes = min(self.idle_scrapes + 1, MAX_IDLE_BACKOFF.bit_length())
