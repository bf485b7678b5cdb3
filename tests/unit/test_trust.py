"""The consumer's trust rule (consumer/trust.py): examples.

The rule under random runs, driven through the consumer engine against the fold of the log, is
tests/unit/test_consumer_engine_properties.py.
"""

from __future__ import annotations

from consumer.trust import WITHDRAWN, Acknowledgements, Computed, Outcome, WatermarkTrust
from watermark_core.protocol import Watermark

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


def test_give_up_after_a_seek_by_time_that_delivered_nothing_withdraws_until_a_message_comes() -> None:
    trust = WatermarkTrust([-1])
    trust.on_event(-1, (L, 50), 500)
    trust.on_seek([-1], None)
    trust.on_event(-1, (L, 70), 700)
    trust.give_up(-1)
    assert trust.watermark() is None, "the target is unknown: the event at 70 may be from before the seek"
    trust.on_message(-1, pos(71))
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
    assert trust.fallback(-1) is None, "nothing known at or before the seek's target"


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


# -- what a partition acknowledged: runs of lane keys, turned into positions only when asked inside (issue 48) ----


class _Key:
    """A lane key as the shell's (the binding's message id): ordered by `<`, no hash, its position by getters."""

    __hash__ = None  # type: ignore[assignment]
    asked = 0

    def __init__(self, entry: int) -> None:
        self.entry = entry

    def __lt__(self, other: _Key) -> bool:
        return self.entry < other.entry

    def ledger_id(self) -> int:
        _Key.asked += 1
        return L

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return -1


def test_a_run_acknowledged_in_order_is_asked_for_positions_only_inside_it() -> None:
    acknowledged = Acknowledgements()
    acknowledged.add(pos(1))
    acknowledged.add_run([_Key(e) for e in range(10, 20)], pos(10), pos(19))
    _Key.asked = 0
    assert pos(1) in acknowledged and pos(5) not in acknowledged and pos(25) not in acknowledged
    assert _Key.asked == 0, "outside the run's ends: no key asked"
    acknowledged.forget_through((L, 5))
    acknowledged.keep_before(pos(30))
    assert _Key.asked == 0 and len(acknowledged) == 10, "the whole run is after entry 5 and before 30"
    assert pos(12) in acknowledged and _Key.asked == 10, "inside: the run becomes positions once"
    assert list(acknowledged) == [pos(e) for e in range(10, 20)]


def test_a_run_cut_inside_asks_only_the_keys_a_binary_search_looks_at() -> None:
    """Issue 48: a new held event forgets what was acknowledged through its entry, which falls inside the latest run
    nearly every time on a busy topic; the run is cut where the entry ends, found by asking about 2 log2(n) keys for
    their positions, not every key of it (on the broker the rule's thread spent 5 700 instructions a message making
    positions of keys it then threw away)."""
    acknowledged = Acknowledgements()
    acknowledged.add_run([_Key(e) for e in range(0, 1000)], pos(0), pos(999))
    _Key.asked = 0
    acknowledged.forget_through((L, 400))
    assert _Key.asked <= 2 * 10 + 2 and len(acknowledged) == 599
    _Key.asked = 0
    acknowledged.keep_before(pos(700))
    assert _Key.asked <= 2 * 10 + 2 and len(acknowledged) == 299
    assert list(acknowledged) == [pos(e) for e in range(401, 700)]
    assert pos(401) in acknowledged and pos(400) not in acknowledged and pos(700) not in acknowledged


def test_forgetting_and_keeping_cut_a_run_where_they_fall_and_keep_the_newest() -> None:
    acknowledged = Acknowledgements()
    acknowledged.add_run([_Key(e) for e in range(0, 10)], pos(0), pos(9))
    acknowledged.add(pos(12))
    acknowledged.add_run([_Key(e) for e in range(20, 30)], pos(20), pos(29))
    acknowledged.forget_through((L, 4))
    assert list(acknowledged) == [pos(e) for e in (*range(5, 10), 12, *range(20, 30))]
    acknowledged.keep_before(pos(25))
    assert list(acknowledged) == [pos(e) for e in (*range(5, 10), 12, *range(20, 25))]
    acknowledged.keep_newest(7)
    assert list(acknowledged) == [pos(e) for e in (9, 12, 20, 21, 22, 23, 24)] and len(acknowledged) == 7
    acknowledged.clear()
    assert not acknowledged and list(acknowledged) == []
