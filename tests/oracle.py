"""The oracle: what every watermark the generator published should have been (issue 17).

The contract makes the watermark at a position a pure function of the log up to it and the
configuration. So at the end of a scenario the oracle reads the data topic, every partition, from
its start with plain non-durable readers (no subscription is touched), folds the markers with the
same state machine and the generator's configuration, and compares EVERY event the generator
published on the companion topic (read from its start, not compacted) with the fold at the
position the event names: the state after every marker at or before (ledger, entry,
LAST_BATCH_INDEX) (`watermark_core.protocol.entry_end`). Malformed markers are skipped, as every
component skips them; W_SNAPSHOT records are skipped too: they change nothing but the position.

Each published event is, against the fold F at its position:

- exact: its event_time equals F (both None counts: before the first W_SET there is no watermark);
- **premature**: above F, or a value where F is None. A consumer could drop or close on it too early;
  the contract forbids it.
- **late**: below F, or None where F has a value. Allowed (the generator trails the log), measured:
  `late_ms` = F - event_time in event-time milliseconds (not counted for None).

And for each (partition, subscription) that exists at the end:

- **stuck**: after the generator had `settle_s` to catch up, the last event published for it (in
  companion-topic order) still differs from the fold at the subscription's final mark-delete position,
  or nothing was published though the fold there has a watermark. A subscription with no event and no
  watermark in the fold is fine.

The whole log must still be readable: without retention Pulsar deletes acknowledged ledgers and a
reader from the start silently begins after them. `check` refuses to judge (`HistoryNotKept`) unless
the topic and its companion keep everything (`keep_history`, or a namespace created with retention),
or the oracle was told the caller read the history before any of it could go (`require_retention=False`
after an early `catch_up`).
"""

from __future__ import annotations

import bisect
import contextlib
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pulsar

from pulsar_access.admin import AdminError, PulsarAdmin, TopicNotFound, durable_subscriptions, mark_delete_of
from pulsar_access.readers import has_message_available
from pulsar_access.topics import full_name, partition_name, watermark_namespace, watermark_topic_for
from watermark_core.protocol import (
    EVENT_PROPERTY,
    HEAD_WATERMARK,
    MalformedMarker,
    MarkerKind,
    Position,
    WatermarkEvent,
    decode_marker,
    decode_table,
    entry_end,
    position_of,
)
from watermark_core.state import WatermarkConfig, WatermarkState

Key = tuple[int, str]
"""(partition, subscription): what the generator publishes a watermark for; partition -1 if not partitioned."""

SETTLE_S = 30.0
"""How long `check` gives the generator to publish the watermark at every subscription's final position."""


class HistoryNotKept(RuntimeError):
    """The log may have lost ledgers (no retention): the oracle cannot know the right answer."""


# -- the pure part: the fold and the verdicts ----------------------------------------------------------


class PartitionFold:
    """The watermark after each marker of one partition, in log order: the fold at any position."""

    def __init__(self, config: WatermarkConfig) -> None:
        self._state = WatermarkState.initial(config)
        self._positions: list[Position] = []
        self._watermarks: list[int | None] = []
        self.malformed: Counter[str] = Counter()
        self.markers = 0
        self.last_read: Position | None = None

    def read(self, properties: Mapping[str, str], payload: bytes, producer: str, position: Position,
             publish_time: int) -> None:  # fmt: skip
        """The next message of the partition (data or marker), in log order; a message read again is ignored."""
        if self.last_read is not None and position <= self.last_read:
            return
        self.last_read = position
        try:
            marker = decode_marker(properties, payload, producer, position, publish_time)
        except MalformedMarker as exc:
            self.malformed[exc.reason] += 1
            return
        if marker is None or marker.kind is MarkerKind.W_SNAPSHOT:
            return
        self._state = self._state.apply(marker)
        self.markers += 1
        self._positions.append(position)
        self._watermarks.append(self._state.watermark)

    def watermark_at(self, position: Position) -> int | None:
        """The watermark after every marker at or before `position` (None before the first W_SET)."""
        index = bisect.bisect_right(self._positions, position)
        return self._watermarks[index - 1] if index else None


def verdict(published: int | None, expected: int | None) -> str:
    """A published watermark against the fold at its position: "exact", "premature" or "late"."""
    if published == expected:
        return "exact"
    if expected is None:
        return "premature"
    if published is None:
        return "late"
    return "premature" if published > expected else "late"


@dataclass(frozen=True)
class Finding:
    kind: str
    """"premature", "late" or "stuck"."""
    partition: int
    subscription: str
    position: tuple[int, int]
    """The position the event names (for stuck: the subscription's final mark-delete position)."""
    published: int | None
    expected: int | None
    seq: int | None = None

    def __str__(self) -> str:
        where = f"{self.subscription}" + (f" partition {self.partition}" if self.partition >= 0 else "")
        return (f"[{self.kind}] {where} at {self.position}: published {self.published}, the log says "
                f"{self.expected}" + (f" (seq {self.seq})" if self.seq is not None else ""))  # fmt: skip


@dataclass
class OracleReport:
    checked: int = 0
    exact: int = 0
    premature: list[Finding] = field(default_factory=list)
    late: list[Finding] = field(default_factory=list)
    stuck: list[Finding] = field(default_factory=list)
    subscriptions: int = 0
    """(partition, subscription) pairs checked for stuck."""
    markers: int = 0
    malformed_markers: int = 0
    malformed_events: int = 0

    def late_ms(self) -> list[int]:
        """How far below the fold each late event with a value was, in event-time milliseconds."""
        return [f.expected - f.published for f in self.late if f.expected is not None and f.published is not None]

    def problems(self) -> list[str]:
        """What the contract forbids: premature and stuck watermarks."""
        return [str(f) for f in self.premature + self.stuck]

    def summary(self) -> dict[str, int | None]:
        late = self.late_ms()
        return {
            "oracle_checked": self.checked,
            "oracle_premature": len(self.premature),
            "oracle_late": len(self.late),
            "oracle_stuck": len(self.stuck),
            "oracle_late_p50_ms": percentile(late, 50),
            "oracle_late_p99_ms": percentile(late, 99),
            "oracle_late_max_ms": max(late) if late else None,
        }

    def __str__(self) -> str:
        late = self.late_ms()
        return (
            f"{self.checked} events checked against {self.markers} markers: {self.exact} exact, "
            f"{len(self.premature)} premature, {len(self.late)} late (p50 {percentile(late, 50)} ms, "
            f"max {max(late) if late else None} ms), {len(self.stuck)} stuck of {self.subscriptions} subscriptions"
        )


def percentile(values: Iterable[int], p: float) -> int | None:
    """The nearest-rank percentile; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def judge_events(folds: Mapping[int, PartitionFold], events: Iterable[WatermarkEvent], report: OracleReport) -> None:
    """Every published event against the fold at the position it names."""
    for event in events:
        fold = folds.get(event.partition)
        if fold is None:
            raise ValueError(f"an event names partition {event.partition}, which the topic does not have: {event}")
        expected = fold.watermark_at(entry_end(*event.position))
        kind = verdict(event.event_time, expected)
        report.checked += 1
        if kind == "exact":
            report.exact += 1
            continue
        finding = Finding(kind, event.partition, event.subscription, event.position, event.event_time, expected,
                          event.seq)  # fmt: skip
        (report.premature if kind == "premature" else report.late).append(finding)


def judge_final(
    folds: Mapping[int, PartitionFold], finals: Mapping[Key, tuple[int, int]], latest: Mapping[Key, WatermarkEvent]
) -> list[Finding]:
    """Subscriptions whose last published watermark is not the fold at their final mark-delete position."""
    stuck = []
    for (partition, subscription), mark_delete in sorted(finals.items()):
        expected = folds[partition].watermark_at(entry_end(*mark_delete))
        last = latest.get((partition, subscription))
        published = last.event_time if last is not None else None
        if published != expected:
            stuck.append(Finding("stuck", partition, subscription, mark_delete, published, expected,
                                 last.seq if last is not None else None))  # fmt: skip
    return stuck


# -- the broker part: reading the log and the companion topic ------------------------------------------


def keep_watermark_history(admin: PulsarAdmin) -> None:
    """The watermark namespace (where companion topics live, docs/SECURITY.md) keeps everything, for the oracle."""
    admin.create_namespace(watermark_namespace())
    admin.set_namespace_retention(watermark_namespace())


def keep_history(admin: PulsarAdmin, topic: str, partitions: int = 0) -> None:
    """Create `topic` (and its companion topic) with a retention that keeps everything, for the oracle.

    For topics in a namespace without retention (public/default); a namespace of one's own gets it
    once with `PulsarAdmin.set_namespace_retention`.
    """
    admin.create_topic(topic, partitions)
    companion = watermark_topic_for(topic)
    with contextlib.suppress(AdminError):  # 409: the generator created it already
        admin.create_topic(companion)
    for name in (topic, companion):
        _set_retention(admin, name)


def _set_retention(admin: PulsarAdmin, topic: str, within_s: float = 10.0) -> None:
    """Topic policies live in the namespace's policy topic, which the broker creates on first use: retry."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            admin.set_topic_retention(topic)
            return
        except AdminError as exc:
            if time.monotonic() > deadline:
                raise AdminError(f"setting the retention of {topic} kept failing: {exc}", exc.status) from exc
            time.sleep(0.2)


class TopicOracle:
    """Reads one topic's log and its companion topic; `check` judges every published watermark.

    Each `catch_up` reads on from where the previous one stopped, with readers it closes again (a
    reader left open could hold on to what Pulsar would otherwise delete). The topic must exist, with
    its partitions, at the first `catch_up`; call it early when the history may be deleted later.
    """

    def __init__(
        self,
        client: pulsar.Client,
        admin: PulsarAdmin,
        topic: str,
        config: WatermarkConfig | None = None,
        *,
        require_retention: bool = True,
    ) -> None:
        self.client = client
        self.admin = admin
        self.topic = full_name(topic)
        self.config = config or WatermarkConfig()
        self.require_retention = require_retention
        self.folds: dict[int, PartitionFold] = {}
        self.events: list[WatermarkEvent] = []
        self.malformed_events = 0
        self._partitions: dict[int, str] | None = None
        self._companion_read: Position | None = None

    # -- reading ------------------------------------------------------------------------------------

    def _partition_topics(self) -> dict[int, str]:
        if self._partitions is None:
            count = self.admin.partitions(self.topic)
            self._partitions = {i: partition_name(self.topic, i) for i in range(count)} if count else {-1: self.topic}
            self.folds = {index: PartitionFold(self.config) for index in self._partitions}
        return self._partitions

    def _read_after(self, topic: str, after: Position | None) -> Iterable[tuple[Position, pulsar.Message]]:
        """Every message of `topic` after `after` (from its start for None), up to its end now."""
        start = pulsar.MessageId.earliest if after is None else pulsar.MessageId(-1, *after)
        reader = self.client.create_reader(topic, start, start_message_id_inclusive=False)
        try:
            for message in _drain(reader):
                msg_id = message.message_id()
                position = position_of(msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index())
                if after is None or position > after:
                    yield position, message
        finally:
            with contextlib.suppress(pulsar.PulsarException):
                reader.close()

    def catch_up(self) -> None:
        """Read the companion topic, then every partition, on to their ends now.

        In that order, so that every event read names a position at or before what the fold has read.
        """
        partitions = self._partition_topics()
        for position, message in self._read_after(watermark_topic_for(self.topic), self._companion_read):
            self._companion_read = position
            if message.properties().get(EVENT_PROPERTY) == HEAD_WATERMARK:
                continue  # the partition head's watermark, not a subscription's
            try:
                table = decode_table(message.data())
            except MalformedMarker:
                self.malformed_events += 1
                continue
            self.events.extend(event for event in table if event.topic == self.topic)
        for index, name in partitions.items():
            fold = self.folds[index]
            for position, message in self._read_after(name, fold.last_read):
                fold.read(message.properties(), message.data(), message.producer_name(), position,
                          message.publish_timestamp())  # fmt: skip

    def final_positions(self) -> dict[Key, tuple[int, int]]:
        """Every application subscription's mark-delete position now, per partition."""
        finals: dict[Key, tuple[int, int]] = {}
        for index, name in self._partition_topics().items():
            subscriptions = durable_subscriptions(self.admin.topic_stats(name))
            cursors = self.admin.internal_stats(name).get("cursors", {})
            for subscription in subscriptions:
                if subscription in cursors:
                    finals[(index, subscription)] = mark_delete_of(cursors[subscription])
        return finals

    def latest(self) -> dict[Key, WatermarkEvent]:
        """The last event published for each (partition, subscription), in companion-topic order."""
        return {(event.partition, event.subscription): event for event in self.events}

    # -- judging ------------------------------------------------------------------------------------

    def check_history_kept(self) -> None:
        if not self.require_retention:
            return
        for name in (self.topic, watermark_topic_for(self.topic)):
            try:
                minutes, size_mb = self.admin.retention(name)
            except TopicNotFound:
                continue  # a companion topic never created: no event to lose
            if minutes != -1 or size_mb != -1:
                raise HistoryNotKept(
                    f"{name} has retention {minutes} min / {size_mb} MB: Pulsar may have deleted acknowledged "
                    "ledgers, so the oracle cannot rebuild the fold; use keep_history() or a namespace with "
                    "set_namespace_retention()"
                )

    def check(self, settle_s: float = SETTLE_S) -> OracleReport:
        """Judge every event published so far, and whether each subscription got its final watermark.

        Waits up to `settle_s` for the generator to publish the fold at every subscription's final
        mark-delete position; broker errors meanwhile (a restart) are retried until then.
        """
        self.check_history_kept()
        deadline = time.monotonic() + settle_s
        while True:
            try:
                finals = self.final_positions()
                self.catch_up()
                stuck = judge_final(self.folds, finals, self.latest())
            except (AdminError, pulsar.PulsarException):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
                continue
            if not stuck or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        report = OracleReport(stuck=stuck, subscriptions=len(finals), malformed_events=self.malformed_events)
        report.markers = sum(fold.markers for fold in self.folds.values())
        report.malformed_markers = sum(sum(fold.malformed.values()) for fold in self.folds.values())
        judge_events(self.folds, self.events, report)
        return report


def _drain(reader: pulsar.Reader) -> Iterable[pulsar.Message]:
    """Every message the reader has now; `NotAnswered` when the broker did not say whether more is there."""
    while has_message_available(reader):
        try:
            yield reader.read_next(timeout_millis=10_000)
        except pulsar.Timeout:
            return


def check_topic(
    client: pulsar.Client,
    admin: PulsarAdmin,
    topic: str,
    config: WatermarkConfig | None = None,
    settle_s: float = SETTLE_S,
) -> OracleReport:
    """Run the oracle once over `topic` (whose history must be kept) and return its report."""
    return TopicOracle(client, admin, topic, config).check(settle_s)


def assert_oracle_agrees(
    client: pulsar.Client,
    admin: PulsarAdmin,
    topic: str,
    config: WatermarkConfig | None = None,
    settle_s: float = SETTLE_S,
    oracle: TopicOracle | None = None,
) -> OracleReport:
    """For tests: no premature and no stuck watermark on `topic`, and at least one event checked."""
    report = oracle.check(settle_s) if oracle is not None else check_topic(client, admin, topic, config, settle_s)
    assert report.problems() == [], f"{report}\n" + "\n".join(report.problems())
    assert report.checked > 0, f"the generator published nothing for {topic}: {report}"
    return report
