"""The consumer's trust rule (watermark_core/trust.py): examples, then a model of broker, generator and consumer.

The model is a small simulation of what the trust rule sits between: a subscription's cursor on
the broker (dispatch, individual acknowledgements, seeks that move the mark-delete position), a
generator that polls the mark-delete position and publishes the watermark there (on a change, and
always after a backward move), a channel that delivers its events late, and a consumer that
receives messages, hands them over only when the rule allows, and holds the acknowledgements the
rule asks it to hold. Hypothesis drives them in any interleaving; the checks are the brief's:
no message is handed over under a watermark computed at or after it, and once everything settles
the consumer trusts again and holds the generator's watermark at the subscription's position.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from watermark_core.protocol import Watermark
from watermark_core.trust import WITHDRAWN, Computed, Outcome, WatermarkTrust

L = 7  # the ledger of every example


def pos(entry: int, batch: int = -1) -> tuple[int, int, int]:
    return (L, entry, batch)


# -- examples --------------------------------------------------------------------------------------------


def test_the_issue_redelivered_message_under_a_high_watermark_waits_for_the_recomputed_one() -> None:
    trust = WatermarkTrust([-1])
    for entry in range(100):  # 50 W_SETs and 50 messages, all acknowledged
        trust.on_message(-1, pos(entry))
        trust.on_acknowledged(-1, pos(entry))
    assert trust.on_event(-1, (L, 99), 49_000) is Outcome.ACCEPTED
    assert trust.watermark() == Watermark(49_000)

    trust.on_message(-1, pos(1))  # seek to earliest: the message with event time 500 comes again
    assert not trust.may_hand_over(-1)
    assert trust.watermark() is None
    assert trust.on_event(-1, (L, 99), 49_000) is Outcome.IGNORED  # stale: published before the seek
    assert trust.on_acknowledged(-1, pos(1)), "the floor's acknowledgement is held back"
    assert trust.on_event(-1, (L, -1), 0) is Outcome.REGAINED  # recomputed at the new mark-delete
    assert trust.may_hand_over(-1)
    assert trust.watermark() == Watermark(0, computed_at=((-1, L, -1),))


def test_a_message_after_the_held_position_changes_nothing() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 10), 100)
    trust.on_message(-1, pos(11))
    assert trust.may_hand_over(-1)
    assert not trust.on_acknowledged(-1, pos(11))


def test_batch_indexes_count_per_entry() -> None:
    """A mark-delete position covers whole entries: every batch index of the entry is before it."""
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 10), 100)
    trust.on_message(-1, pos(10, 3))
    assert trust.distrusting(-1)
    assert trust.state(-1).floor == (L, 10)
    assert trust.on_event(-1, (L, 10), 100) is Outcome.IGNORED
    assert trust.on_acknowledged(-1, pos(10, 4)), "another message of the floor's entry"
    assert not trust.on_acknowledged(-1, pos(11, 0))
    assert trust.on_event(-1, (L, 9), 90) is Outcome.REGAINED


def test_the_floor_only_goes_down_and_the_event_must_be_before_it() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 20), 200)
    trust.on_message(-1, pos(15))
    trust.on_message(-1, pos(16))
    trust.on_message(-1, pos(12))  # a Shared subscription's redelivery after a failover: earlier still
    assert trust.state(-1).floor == (L, 12)
    assert trust.on_event(-1, (L, 13), 130) is Outcome.IGNORED
    assert trust.on_event(-1, (L, 12), 120) is Outcome.IGNORED
    assert trust.on_event(-1, (L, 11), 110) is Outcome.REGAINED


def test_an_event_computed_after_an_unacknowledged_message_is_stale() -> None:
    """A seek after the generator's poll: the message comes later than the held event, the stale event after it."""
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 10), 100)
    trust.on_message(-1, pos(12))
    assert trust.on_event(-1, (L, 20), 200) is Outcome.DISTRUSTED
    assert trust.state(-1).floor == (L, 12)
    assert trust.state(-1).held == Computed((L, 10), 100)
    assert trust.on_acknowledged(-1, pos(12))
    assert trust.on_event(-1, (L, 11), 110) is Outcome.REGAINED


def test_acknowledged_messages_do_not_contradict_events() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 10), 100)
    for entry in range(11, 15):
        trust.on_message(-1, pos(entry))
    for entry in range(11, 14):
        trust.on_acknowledged(-1, pos(entry))
    assert trust.on_event(-1, (L, 13), 130) is Outcome.ACCEPTED
    assert trust.on_event(-1, (L, 14), 140) is Outcome.DISTRUSTED  # 14 is still unacknowledged


def test_a_copy_waiting_for_the_listener_holds_back_a_later_event_even_when_its_first_copy_is_acknowledged() -> None:
    """Chaos seed 122113 (Shared, admin resets with consumers attached): message 132 was delivered, then
    delivered again after a reset while the first copy was still with the application; the application
    acknowledged the first copy (by message id, the same for both), and the final watermark, computed at
    307, came while the second copy still waited in the listener's queue: it must not come first."""
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 62), 100)
    for entry in (132, 133):
        trust.on_message(-1, pos(entry), queued=True)
        trust.on_handed_over(-1, pos(entry))  # the first copies are with the application
    for entry in (132, 133):
        trust.on_message(-1, pos(entry), queued=True)  # the reset delivers them again, to the listener's queue
    for entry in (132, 133):
        assert not trust.on_acknowledged(-1, pos(entry))  # the application acknowledges the first copies
    assert trust.on_event(-1, (L, 307), 900) is Outcome.DEFERRED
    assert trust.listener_watermark(None) == Watermark(100), "the queued copies come under the older one"
    assert trust.may_hand_over(-1)
    trust.on_handed_over(-1, pos(132))
    assert trust.listener_watermark(None) == Watermark(100), "133 still waits"
    trust.on_handed_over(-1, pos(133))
    assert trust.listener_watermark(None) == Watermark(900)
    assert trust.drain_regained() == [-1]


def test_an_event_before_every_queued_copy_is_taken_at_once() -> None:
    trust = WatermarkTrust([-1])
    trust.on_message(-1, pos(20), queued=True)
    assert trust.on_event(-1, (L, 19), 190) is Outcome.ACCEPTED
    trust.on_seek([-1], (L, 30))
    assert trust.state(-1).queued == {}, "a seek drops what waits for the listener"


def test_a_cumulative_acknowledgement_covering_the_floor_is_held() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 10), 100)
    trust.on_message(-1, pos(5))
    trust.on_message(-1, pos(6))
    assert trust.on_acknowledged_through(-1, pos(6))
    assert trust.state(-1).outstanding == set()
    assert not WatermarkTrust([-1]).on_acknowledged_through(-1, pos(6))


def test_seek_back_by_message_id_distrusts_at_once_and_the_first_message_replaces_the_target() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 50), 500)
    trust.on_seek([-1], (L, 20))
    assert trust.watermark() is None
    assert trust.on_event(-1, (L, 50), 500) is Outcome.IGNORED
    trust.on_message(-1, pos(30))  # the seek's target was deleted; delivery starts later
    assert trust.state(-1).floor == (L, 30)
    assert trust.on_event(-1, (L, 29), 290) is Outcome.REGAINED


def test_seek_forward_keeps_the_held_watermark() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 50), 500)
    trust.on_seek([-1], (L, 80))
    assert not trust.distrusting(-1)
    assert trust.watermark() == Watermark(500)
    trust.on_seek([-1], (2**63 - 1, 2**63 - 1))  # MessageId.latest
    assert not trust.distrusting(-1)


def test_seek_by_time_takes_an_event_from_before_the_held_one_or_waits_for_the_first_message() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 50), 500)
    trust.on_seek([-1], None)
    assert trust.on_event(-1, (L, 50), 500) is Outcome.IGNORED, "maybe stale: published before the seek"
    assert trust.on_event(-1, (L, 40), 400) is Outcome.REGAINED, "computed after a move back"
    trust.on_message(-1, pos(30))  # an admin reset to further back had come before the seek
    assert trust.distrusting(-1)

    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 50), 500)
    trust.on_seek([-1], None)
    assert trust.on_event(-1, (L, 60), 600) is Outcome.IGNORED, "stale, or a seek forward: not known yet"
    trust.on_message(-1, pos(61))
    assert not trust.distrusting(-1), "forward: the event that came first is before the first message, taken"
    assert trust.drain_regained() == [-1]
    assert trust.watermark() == Watermark(600)


def test_seek_to_earliest_waits_for_the_first_message() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 50), 500)
    trust.on_seek([-1], (-1, -1))
    assert trust.on_event(-1, (L, -1), None) is Outcome.IGNORED
    trust.on_message(-1, pos(0))
    assert not trust.distrusting(-1)
    assert trust.watermark() is None and trust.listener_watermark(Watermark(500)) is None


def test_give_up_after_a_seek_that_delivered_nothing_trusts_again() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 50), 500)
    trust.on_seek([-1], None)
    trust.on_event(-1, (L, 70), 700)
    trust.give_up(-1)
    assert trust.watermark() == Watermark(700)


def test_a_forward_seek_ends_a_distrust() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 50), 500)
    trust.on_message(-1, pos(3))
    assert trust.on_acknowledged(-1, pos(3))
    trust.on_seek([-1], (L, 60))
    assert not trust.distrusting(-1)
    assert trust.drain_regained() == [-1], "the held acknowledgement may go"


def test_seek_forgets_what_was_received_before_it() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 10), 100)
    trust.on_message(-1, pos(11))
    trust.on_seek([-1], (L, 30))  # forward, past the message received and never acknowledged
    assert trust.on_event(-1, (L, 29), 290) is Outcome.ACCEPTED


def test_an_event_without_watermark_takes_it_away() -> None:
    """Issue #17, counterexample 1: a seek to before the first W_SET."""
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 50), 500)
    trust.on_message(-1, pos(0))
    assert trust.on_event(-1, (L, -1), None) is Outcome.REGAINED
    assert trust.watermark() is None
    assert trust.listener_watermark(Watermark(500)) is None
    assert trust.may_hand_over(-1)


def test_give_up_withdraws_and_trusts_the_next_event() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 50), 500)
    trust.on_message(-1, pos(3))
    trust.give_up(-1)
    assert trust.state(-1).held == WITHDRAWN
    assert trust.may_hand_over(-1)
    assert trust.listener_watermark(Watermark(500)) is None
    assert trust.on_event(-1, (L, 60), 600) is Outcome.IGNORED, "beyond what came since: maybe from before the move"
    trust.on_message(-1, pos(61))
    assert trust.state(-1).held == WITHDRAWN, "message 3 is still unacknowledged"
    trust.on_acknowledged(-1, pos(3))
    assert trust.state(-1).held == Computed((L, 60), 600)
    trust.on_acknowledged(-1, pos(61))
    assert trust.on_event(-1, (L, 61), 610) is Outcome.ACCEPTED, "within what came: not from before the move"


def test_give_up_falls_back_on_the_latest_event_when_another_consumer_acknowledged_the_copy() -> None:
    """Chaos seed 214393 (Shared, resets with consumers attached): this consumer held message 20 when the
    generator computed at 30 (another consumer had acknowledged its copy of 20). The event is refused
    while 20 is unacknowledged; no event before 20 ever comes. At the time limit, with 20 acknowledged,
    the best fact at or before what came (20) stands; the latest event once a message after it came
    (an event read late may be from before a move back: case 1 of issue 25)."""
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 10), 100)
    trust.on_message(-1, pos(20))
    assert trust.on_event(-1, (L, 30), 300) is Outcome.DISTRUSTED
    assert trust.on_acknowledged(-1, pos(20)), "held: it covers the floor"
    assert trust.distrusting(-1)
    trust.give_up(-1)
    assert trust.state(-1).held == Computed((L, 10), 100)
    assert trust.may_hand_over(-1)
    trust.on_message(-1, pos(31))
    assert trust.watermark() == Watermark(300, computed_at=((-1, L, 30),))


def test_give_up_with_a_message_still_held_falls_back_before_it_and_takes_the_latest_once_acknowledged() -> None:
    trust = WatermarkTrust([-1])
    trust.on_fact(-1, (L, 5), 50)
    trust.on_event(-1, (L, 10), 100)
    trust.on_fact(-1, (L, 18), 180)
    trust.on_message(-1, pos(20))
    trust.on_fact(-1, (L, 25), 250)  # after the message: no fact for it
    assert trust.on_event(-1, (L, 30), 300) is Outcome.DISTRUSTED
    trust.give_up(-1)
    assert trust.state(-1).held == Computed((L, 18), 180), "the latest fact before the message still held"
    assert not trust.on_acknowledged(-1, pos(20))
    trust.on_message(-1, pos(31))
    assert trust.state(-1).held == Computed((L, 30), 300), "nothing contradicts the latest event any more"


def test_give_up_hands_a_redelivered_copy_over_under_a_head_fact_before_it() -> None:
    """A copy of 20 delivered again (rule 1) that another consumer acknowledged: the head event the
    generator published at 19 is the watermark there, whatever the subscription did since."""
    trust = WatermarkTrust([-1])
    trust.on_fact(-1, (L, 19), 190)
    trust.on_event(-1, (L, 30), 300)
    trust.on_message(-1, pos(20), queued=True)
    assert not trust.may_hand_over(-1)
    trust.give_up(-1)
    assert trust.may_hand_over(-1)
    assert trust.listener_watermark(Watermark(300)) == Watermark(190, computed_at=((-1, L, 19),))
    trust.on_handed_over(-1, pos(20))
    assert trust.state(-1).held == Computed((L, 19), 190), "20 is still unacknowledged: the event at 30 waits"
    trust.on_acknowledged(-1, pos(20))
    trust.on_message(-1, pos(31))
    assert trust.state(-1).held == Computed((L, 30), 300)


def test_fallback_names_what_giving_up_would_hold_and_none_where_it_would_withdraw() -> None:
    """The consumer gives up early (`fallback_wait_s`) only where this is not None."""
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 30), 300)
    trust.on_message(-1, pos(25), queued=True)
    assert trust.fallback(-1) is None, "no fact before 25"
    trust.on_fact(-1, (L, 24), 240)
    assert trust.fallback(-1) == Computed((L, 24), 240)
    trust.on_seek([-1], (L, 10))
    assert trust.fallback(-1) == Computed((L, 30), 300), "a seek that delivered nothing: the held event again"


def test_give_up_takes_no_fact_from_beyond_the_latest_event() -> None:
    """A head fact ahead of where the subscription was last seen would only distrust the messages to come."""
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 30), 300)
    trust.on_fact(-1, (L, 40), 400)
    trust.on_message(-1, pos(25))
    trust.give_up(-1)
    assert trust.state(-1).held == WITHDRAWN


def test_partitioned_minimum_strict_and_for_the_listener() -> None:
    trust = WatermarkTrust([0, 1])
    trust.on_event(0, (L, 5), 100)
    assert trust.watermark() is None and trust.listener_watermark(None) is None
    trust.on_event(1, (8, 3), 300)
    assert trust.watermark() == Watermark(100, computed_at=((0, L, 5), (1, 8, 3)))
    assert trust.watermark() is not None and trust.watermark().computed_at == ((0, L, 5), (1, 8, 3))  # type: ignore[union-attr]

    trust.on_message(1, (8, 2, -1))  # partition 1 moved back
    assert trust.watermark() is None, "strict: a distrusted partition has no watermark"
    assert trust.listener_watermark(Watermark(100)) == Watermark(100), "its messages wait; the old value stands"
    assert trust.may_hand_over(0) and not trust.may_hand_over(1)
    trust.on_event(1, (8, 1), 50)
    assert trust.listener_watermark(Watermark(100)) == Watermark(50)


def test_a_partition_added_later_holds_the_watermark_back() -> None:
    """Issue #17, counterexample 6: a new partition without a watermark yet."""
    trust = WatermarkTrust([0])
    trust.on_event(0, (L, 5), 100)
    assert trust.listener_watermark(None) == Watermark(100)
    assert trust.add_partition(1) and not trust.add_partition(1)
    assert trust.watermark() is None
    trust.on_event(0, (L, 9), 900)
    assert trust.listener_watermark(Watermark(100)) == Watermark(100), "not raised while partition 1 has none"
    assert trust.listener_watermark(None) is None
    trust.on_event(0, (L, 2), 20)  # partition 0 moved back below what the listener holds: lower it
    assert trust.listener_watermark(Watermark(100)) == Watermark(20)
    trust.on_event(1, (3, 0), 700)
    assert trust.listener_watermark(Watermark(20)) == Watermark(20)
    trust.on_event(0, (L, 9), 900)
    assert trust.listener_watermark(Watermark(20)) == Watermark(700)


# -- the model -------------------------------------------------------------------------------------------


@dataclass
class Cursor:
    """One partition's subscription cursor on the broker."""

    size: int
    acked: set[int] = field(default_factory=set)
    read: int = 0
    skipped: set[int] = field(default_factory=set)
    """Entries a seek forward acknowledged, that no consumer had acknowledged."""

    def mark_delete(self) -> int:
        entry = -1
        while entry + 1 in self.acked:
            entry += 1
        return entry

    def seek(self, target: int) -> None:
        """Pulsar's seek and reset-cursor: the mark-delete position is just before the target."""
        self.skipped = {e for e in self.skipped if e < target} | (set(range(target)) - self.acked)
        self.acked = set(range(target))
        self.read = target


_UNSET = object()


@dataclass
class Generator:
    """The generator's tracker of one subscription: polls the mark-delete position, publishes changes.

    As broker_ext/partition_worker.py does: a value is published when it differs from the last one
    published; a backward move forgets what was published, so the recomputed value goes out even
    when equal; a state without a watermark is published only after a backward move, and only by a
    generator that publishes such events (`publishes_none`, issue #17's counterexample 1).
    """

    watermarks: list[int | None]
    """The watermark at mark-delete position e is watermarks[e + 1]."""
    publishes_none: bool
    seen: int | None = None
    published: object = _UNSET

    def poll(self, cursor: Cursor) -> tuple[int, int | None] | None:
        at = cursor.mark_delete()
        value = self.watermarks[at + 1]
        back = self.seen is not None and at < self.seen
        self.seen = at
        if back:
            self.published = _UNSET
            if value is None and self.publishes_none:
                self.published = None
                return (at, None)
        if value is not None and value != self.published:
            self.published = value
            return (at, value)
        return None


@dataclass
class Log:
    """An honest log: event times never below the watermark at the position before them.

    Entry e is a W_SET marker where the watermark changes just after it (`watermarks[e + 1] !=
    watermarks[e]`); consumers acknowledge markers as soon as they receive them.
    """

    watermarks: list[int | None]
    event_times: list[int]

    def is_marker(self, entry: int) -> bool:
        return self.watermarks[entry + 1] != self.watermarks[entry]


@st.composite
def logs(draw: st.DrawFn, size: int = 10) -> Log:
    first = draw(st.integers(0, size))
    steps = draw(st.lists(st.integers(0, 3), min_size=size, max_size=size))
    watermarks: list[int | None] = [None] * (first + 1)
    value = 0
    for step in steps[first:]:
        value += step * 10
        watermarks.append(value)
    watermarks = watermarks[: size + 1]
    event_times = [
        (watermarks[e] or 0) + draw(st.integers(0, 25)) for e in range(size)
    ]  # message e comes after mark-delete position e - 1
    return Log(watermarks, event_times)


@dataclass
class Consumer:
    """The shell around the trust rule, as WatermarkConsumer and WatermarkFeed are, for several partitions.

    `listener`: messages wait in a queue until the rule lets them be handed over (and the listener
    watermark is checked then); otherwise `receive()`: handed over at once, checked against the
    strict watermark.
    """

    trust: WatermarkTrust
    cursors: dict[int, Cursor]
    logs: dict[int, Log]
    listener: bool
    in_flight: dict[int, deque[int]]
    queue: deque[tuple[int, int]] = field(default_factory=deque)
    handed: list[tuple[int, int]] = field(default_factory=list)
    held_acks: dict[int, list[Callable[[], None]]] = field(default_factory=dict)
    delivered: Watermark | None = None

    def ack(self, partition: int, entry: int) -> None:
        def send() -> None:
            self.cursors[partition].acked.add(entry)

        if self.trust.on_acknowledged(partition, (L, entry, -1)):
            self.held_acks.setdefault(partition, []).append(send)
        else:
            send()
        self.release_regained()

    def release(self, partition: int) -> None:
        for send in self.held_acks.pop(partition, []):
            send()

    def release_regained(self) -> None:
        for partition in self.trust.drain_regained():
            self.release(partition)

    def receive(self, partition: int, entry: int) -> None:
        marker = self.logs[partition].is_marker(entry)
        self.trust.on_message(partition, (L, entry, -1), queued=self.listener and not marker)
        self.release_regained()
        if marker:
            self.ack(partition, entry)
        elif self.listener:
            self.queue.append((partition, entry))
        else:
            self.check(partition, entry, self.trust.watermark())
            self.handed.append((partition, entry))

    def update_listener(self) -> None:
        """What the consumer's dispatcher does: take the listener watermark (the same value with newer
        positions silently, a new value by handing it over) and check it."""
        if not self.listener:
            return
        new = self.trust.listener_watermark(self.delivered)
        if new is not None and new is not self.delivered:
            self.check_against_unacknowledged(new)
        self.delivered = new

    def check_against_unacknowledged(self, watermark: Watermark) -> None:
        """A watermark handed over is never computed at or after a handed message the broker has not acknowledged."""
        at = {p: (ledger, entry) for p, ledger, entry in watermark.computed_at}
        for partition, entry in self.handed:
            if entry not in self.cursors[partition].acked and partition in at:
                assert at[partition] < (L, entry), f"watermark from {at[partition]} over unacknowledged {entry}"

    def check(self, partition: int, entry: int, watermark: Watermark | None) -> None:
        """The brief's rule: never a message handed over under a watermark computed at or after it."""
        if watermark is None:
            return
        at = {p: (ledger, e) for p, ledger, e in watermark.computed_at}
        assert partition not in at or at[partition] < (L, entry), (
            f"message {entry} of partition {partition} handed over under a watermark computed at {at[partition]}"
        )
        assert self.logs[partition].event_times[entry] >= watermark.event_time, "a late message"

    def hand_over(self) -> bool:
        if not self.queue:
            return False
        partition, entry = self.queue[0]
        if not self.trust.may_hand_over(partition):
            return False
        self.queue.popleft()
        self.update_listener()
        self.trust.on_handed_over(partition, (L, entry, -1))
        self.release_regained()
        self.check(partition, entry, self.delivered)
        self.handed.append((partition, entry))
        return True


OPS = (
    "flow", "dispatch", "receive", "hand", "ack", "poll", "event", "head", "seek", "seek_by_time", "reset", "give_up"
)  # fmt: skip
"""`flow`: a few messages go through dispatch, receive, hand-over and acknowledgement, as most of the time."""
WEIGHTED = ("flow", "flow", "flow", "poll", "poll", "event", "event", "dispatch", "receive", "hand", "ack",
            "head", "seek", "seek_by_time", "reset")  # fmt: skip


def run_model(
    log_by_partition: dict[int, Log],
    ops: list[tuple[str, int, int]],
    *,
    publishes_none: bool = True,
    settle: bool = True,
    listener: bool = True,
) -> Consumer:
    size = len(next(iter(log_by_partition.values())).event_times)
    partitions = sorted(log_by_partition)
    trust = WatermarkTrust(partitions)
    cursors = {p: Cursor(size) for p in partitions}
    generators = {p: Generator(log_by_partition[p].watermarks, publishes_none) for p in partitions}
    channel: deque[tuple[int, tuple[int, int | None]]] = deque()
    consumer = Consumer(trust, cursors, log_by_partition, listener, {p: deque() for p in partitions})

    def step(op: str, partition: int, arg: int) -> None:
        cursor = cursors[partition]
        if op == "flow":
            for _ in range(arg % 5 + 1):
                for then in ("dispatch", "receive", "hand"):
                    step(then, partition, 0)
                if consumer.handed:
                    step("ack", partition, 0)
        elif op == "dispatch":
            while cursor.read < size and cursor.read in cursor.acked:  # Pulsar skips what is acknowledged
                cursor.read += 1
            if cursor.read < size:
                consumer.in_flight[partition].append(cursor.read)
                cursor.read += 1
        elif op == "receive" and consumer.in_flight[partition]:
            consumer.receive(partition, consumer.in_flight[partition].popleft())
        elif op == "hand":
            consumer.hand_over()
        elif op == "ack" and consumer.handed:
            p, entry = consumer.handed.pop(arg % len(consumer.handed))
            consumer.ack(p, entry)
        elif op == "poll":
            published = generators[partition].poll(cursor)
            if published is not None:
                channel.append((partition, published))
        elif op == "event" and channel:
            p, (at, value) = channel.popleft()
            trust.on_event(p, (L, at), value)
            consumer.release_regained()
            consumer.update_listener()
        elif op == "head":  # a head event: the fold of the log at an entry, whatever the cursor does
            entry = arg % size
            value = log_by_partition[partition].watermarks[entry + 1]
            if value is not None:
                trust.on_fact(partition, (L, entry), value)
        elif op in ("seek", "seek_by_time", "reset"):
            target = arg % (size + 1)
            if op != "reset":  # the client sends what the application acknowledged before it seeks
                consumer.release(partition)
            cursor.seek(target)
            consumer.in_flight[partition].clear()  # the client drops what it had not handed to us
            if op != "reset":  # our own seek drops what we had not handed over either (reset: we do not know)
                consumer.queue = deque(item for item in consumer.queue if item[0] != partition)
            if arg >= 100:  # the generator publishes between Pulsar's seek and the consumer's note of it
                step("poll", partition, 0)
                while channel:
                    step("event", partition, 0)
            if op == "seek":
                trust.on_seek([partition], (L, target))
            elif op == "seek_by_time":
                trust.on_seek([partition], None)
        elif op == "give_up" and trust.distrusting(partition):
            trust.give_up(partition)
            consumer.release(partition)
            consumer.update_listener()

    for op, partition, arg in ops:
        step(op, partitions[partition % len(partitions)], arg)

    def settle_once() -> None:
        for _ in range(20 * size + 20):
            for p in partitions:
                for op in ("dispatch", "receive", "poll"):
                    step(op, p, 0)
            while consumer.hand_over():
                pass
            while consumer.handed:
                step("ack", partitions[0], 0)
            while channel:
                step("event", partitions[0], 0)

    if settle:
        settle_once()
        withdrawn = False
        for p in partitions:
            state = trust.state(p)
            if state.provisional:  # a seek that delivered nothing: the consumer's time limit ends it
                step("give_up", p, 0)
            elif state.floor is not None:
                # Stuck only where the generator cannot publish before the floor: a reset forward
                # acknowledged the floor's entry (a message we held), not a consumer. The time limit
                # ends it without a watermark, until the generator publishes a new one.
                assert state.floor[1] in cursors[p].skipped, (state, cursors[p])
                step("give_up", p, 0)
                withdrawn = True
        settle_once()
        assert not consumer.queue and not any(consumer.in_flight.values())
        for p in partitions:
            assert not trust.distrusting(p), f"partition {p} still distrusted after everything settled"
        expected = [log_by_partition[p].watermarks[cursors[p].mark_delete() + 1] for p in partitions]
        strict = trust.watermark()
        if any(value is None for value in expected):
            assert strict is None
        elif not (withdrawn and strict is None):
            assert strict is not None and strict.event_time == min(v for v in expected if v is not None)
    return consumer


def operations(alphabet: tuple[str, ...] = WEIGHTED) -> st.SearchStrategy[list[tuple[str, int, int]]]:
    return st.lists(st.tuples(st.sampled_from(alphabet), st.integers(0, 1), st.integers(0, 200)), max_size=80)


@settings(max_examples=1500, deadline=None)
@given(log=logs(), ops=operations(), listener=st.booleans())
def test_model_one_partition(log: Log, ops: list[tuple[str, int, int]], listener: bool) -> None:
    """Never a message handed over under a watermark computed at or after it; afterwards, the generator's watermark."""
    run_model({-1: log}, ops, listener=listener)


@settings(max_examples=400, deadline=None)
@given(log=logs(), ops=operations(), listener=st.booleans())
def test_model_a_generator_that_publishes_no_empty_state_is_still_never_trusted_blindly(
    log: Log, ops: list[tuple[str, int, int]], listener: bool
) -> None:
    """Today's generator publishes nothing for a state without a watermark: safe, not always live."""
    run_model({-1: log}, ops, publishes_none=False, settle=False, listener=listener)


@settings(max_examples=500, deadline=None)
@given(first=logs(size=8), second=logs(size=8), ops=operations(), listener=st.booleans())
def test_model_two_partitions(first: Log, second: Log, ops: list[tuple[str, int, int]], listener: bool) -> None:
    run_model({0: first, 1: second}, ops, listener=listener)


@settings(max_examples=400, deadline=None)
@given(log=logs(), ops=operations((*WEIGHTED, "head", "give_up")), listener=st.booleans())
def test_model_with_giving_up_stays_safe(log: Log, ops: list[tuple[str, int, int]], listener: bool) -> None:
    """`give_up` trusts without evidence, but never hands a message over under a watermark computed after it."""
    run_model({-1: log}, ops, publishes_none=False, settle=False, listener=listener)


def test_model_finds_the_bug_without_the_rule() -> None:
    """The model can fail: a consumer that trusts every event hands a replayed message over under a higher watermark."""
    log = Log([None, 10, 20, 30, 40, 50], [10, 20, 30, 40, 50])
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 4), 50)
    delivered = trust.listener_watermark(None)
    assert delivered is not None and log.event_times[0] < delivered.event_time  # what the old consumer did
    trust.on_message(-1, (L, 0, -1))
    assert not trust.may_hand_over(-1)  # what the rule does instead


def test_model_a_stale_event_that_arrives_after_a_replayed_message() -> None:
    """The generator polled before an admin reset; its event arrives after the replayed message: refused."""
    log = Log([None, 10, 10, 20, 20, 30, 30, 40, 40, 50, 50], [10, 10, 10, 20, 20, 30, 30, 40, 40, 50])
    ops = [("flow", 0, 4), ("flow", 0, 2), ("poll", 0, 0), ("reset", 0, 1), ("dispatch", 0, 0), ("receive", 0, 0)]
    ops += [("event", 0, 0), ("hand", 0, 0)]
    for listener in (True, False):
        consumer = run_model({-1: log}, ops, listener=listener)
        assert consumer.trust.watermark() == Watermark(50)


def test_model_seek_forward_while_the_generator_publishes_in_between() -> None:
    """The generator's event for the new position comes before the consumer notes its own seek forward."""
    log = Log([None, 10, 10, 20, 20, 30, 30, 40, 40, 50, 50], [10, 10, 10, 20, 20, 30, 30, 40, 40, 50])
    ops = [("dispatch", 0, 0), ("receive", 0, 0), ("poll", 0, 0), ("event", 0, 0)]  # the marker: watermark 10
    ops += [("dispatch", 0, 0), ("receive", 0, 0), ("hand", 0, 0)]  # m1 handed over, never acknowledged
    ops += [("seek", 0, 109)]  # to the end (target 109 % 11 = 10: after the last entry), the generator in between
    consumer = run_model({-1: log}, ops, settle=False)
    assert consumer.trust.watermark() == Watermark(50)


def test_model_seek_by_time_lands_after_the_held_event_but_before_a_stale_one() -> None:
    """Found by hypothesis: the event for the old position (watermark 10, computed at entry 7) is refused
    for the first message after a seek by time back to entry 6, which is still after the held event's
    position (entry 5). The partition distrusts from entry 6, so the generator sees the move back and
    republishes; otherwise nothing reconsiders the refused event and the consumer holds 0 for good."""
    log = Log([None, 0, 0, 0, 0, 0, 0, 0, 10], [0] * 8)
    ops = [("flow", 0, 4), ("flow", 0, 0), ("poll", 0, 0), ("flow", 0, 1), ("poll", 0, 0), ("event", 0, 0)]
    ops += [("seek_by_time", 0, 6), ("event", 0, 0), ("flow", 0, 0)]
    for listener in (True, False):
        consumer = run_model({0: log, 1: log}, ops, listener=listener)
        assert consumer.trust.watermark() == Watermark(10, computed_at=((0, L, 7), (1, L, 7)))
