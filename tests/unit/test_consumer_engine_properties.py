"""The real consumer engine against the fold of the log (hypothesis, on tests/unit/consumer_world.py).

Random logs of honest producers; random consumer actions: deliveries, acknowledgements (one or
cumulative), negative acknowledgements and redeliveries, seeks both ways by id, by time and to the
start, an operator's reset-cursor, another consumer of the Shared subscription taking, acknowledging and
giving back copies, partitions added; the generator's events read late, or not published for a while.
The checks (consumer_world.py): `get_last_watermark()` is never above a message still to come, a listener
is never handed a message older than the watermark it comes under, the watermark goes back only after
a move back; and once the generator is live and everything is acknowledged, it is the fold of the log at
the mark-delete position.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.consumer_world import ConsumerWorld, Entry

EXAMPLES = int(os.environ.get("CONSUMER_ENGINE_EXAMPLES", "300"))
PRODUCERS = ("a", "b")


@st.composite
def logs(draw: st.DrawFn, start: int = 1000) -> list[Entry]:
    """An honest log: each producer opens with a W_SET; W_SETs never go down; data at or above its own."""
    latest = {p: start + draw(st.integers(0, 300)) for p in draw(st.sampled_from([PRODUCERS[:1], PRODUCERS]))}
    log = [Entry(p, t, True) for p, t in sorted(latest.items(), key=lambda item: item[1])]  # the fold never goes down
    for _ in range(draw(st.integers(0, 25))):
        producer = draw(st.sampled_from(sorted(latest)))
        if draw(st.booleans()):
            latest[producer] += draw(st.integers(0, 200))
            log.append(Entry(producer, latest[producer], True))
        else:
            log.append(Entry(producer, latest[producer] + draw(st.integers(0, 300)), False))
    if draw(st.booleans()):  # data before the first W_SET of its producer: no watermark holds there
        log.insert(0, Entry("early", draw(st.integers(0, 2000)), False))
    return log


SEEKS = ("id", "inclusive", "time", "earliest", "reset")

actions = st.lists(
    st.one_of(
        st.tuples(st.just("deliver"), st.integers(0, 3), st.integers(1, 6)),
        st.tuples(st.just("ack"), st.integers(0, 20), st.integers(1, 3)),
        st.tuples(st.just("ack_cumulative"), st.integers(0, 20)),
        st.tuples(st.just("nack"), st.integers(0, 20)),
        st.tuples(st.just("ack_timeout"), st.integers(0, 20)),
        st.tuples(st.just("copy_acknowledged_elsewhere"), st.integers(0, 20)),
        st.tuples(st.just("other_take"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("other_ack"), st.integers(0, 3), st.integers(0, 5)),
        st.tuples(st.just("other_give_back"), st.integers(0, 3), st.integers(0, 5)),
        st.tuples(st.just("seek"), st.integers(0, 3), st.integers(-1, 30), st.sampled_from(SEEKS)),
        st.tuples(st.just("reset_while_in_flight"), st.integers(0, 3), st.integers(1, 12), st.integers(1, 4)),
        st.tuples(st.just("poll")),
        st.tuples(st.just("poll")),
        st.tuples(st.just("caught_up")),
        st.tuples(st.just("restate")),
        st.tuples(st.just("read_to_end")),
        st.tuples(st.just("read"), st.integers(1, 5)),
        st.tuples(st.just("read"), st.integers(1, 5)),
        st.tuples(st.just("tick"), st.sampled_from((0.5, 2.0, 6.0, 31.0))),
        st.tuples(st.just("generator"), st.booleans()),
        st.tuples(st.just("produce"), st.integers(0, 3), st.integers(0, 400), st.booleans()),
        st.tuples(st.just("add_partition")),
    ),
    max_size=60,
)


def play(world: ConsumerWorld, script: list[tuple[object, ...]], new_log: list[Entry]) -> None:
    partitions = lambda index: sorted(world.partitions)[int(index) % len(world.partitions)]  # noqa: E731
    for action, *args in script:
        if action == "deliver":
            for _ in range(int(args[1])):  # type: ignore[call-overload]
                world.deliver(partitions(args[0]))
        elif action == "ack":
            for _ in range(int(args[1])):  # type: ignore[call-overload]
                world.ack(int(args[0]))  # type: ignore[call-overload]
        elif action == "ack_cumulative":
            world.ack(int(args[0]), cumulative=True)  # type: ignore[call-overload]
        elif action == "copy_acknowledged_elsewhere":
            world.copy_acknowledged_elsewhere(int(args[0]))  # type: ignore[call-overload]
        elif action == "ack_timeout":
            world.ack_timeout(int(args[0]))  # type: ignore[call-overload]
        elif action == "nack":
            world.nack(int(args[0]))  # type: ignore[call-overload]
        elif action == "other_take":
            for _ in range(int(args[1])):  # type: ignore[call-overload]
                world.deliver(partitions(args[0]), to_other=True)
        elif action in ("other_ack", "other_give_back"):
            world.other(partitions(args[0]), int(args[1]), acknowledge=action == "other_ack")  # type: ignore[call-overload]
        elif action == "seek":
            world.seek(partitions(args[0]), int(args[1]), str(args[2]))  # type: ignore[call-overload]
        elif action == "reset_while_in_flight":
            world.reset_while_in_flight(partitions(args[0]), int(args[1]), int(args[2]))  # type: ignore[call-overload]
        elif action == "caught_up":
            world.caught_up()
        elif action == "restate":
            world.restate()
        elif action == "read_to_end":
            world.read_to_end()
        elif action == "poll":
            world.generator_poll()
        elif action == "read":
            world.read_events(int(args[0]))  # type: ignore[call-overload]
        elif action == "tick":
            world.tick(float(args[0]))  # type: ignore[arg-type]
        elif action == "generator":
            world.generator_up = bool(args[0])  # a setter: see `ConsumerWorld.missed`
        elif action == "produce":
            partition = partitions(args[0])
            log = world.partitions[partition].log
            producer = log[-1].producer if log and log[-1].producer != "early" else "a"
            floor = max((e.event_time for e in log if e.producer == producer and e.marker), default=0)
            world.append(partition, Entry(producer, floor + int(args[1]), bool(args[2])))  # type: ignore[call-overload]
        elif action == "add_partition" and -1 not in world.partitions and len(world.partitions) < 4:
            world.add_partition(new_log)


RELAXED = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
    # `make test`'s 300 examples are the same every run (CI must not turn red by chance); a run with
    # CONSUMER_ENGINE_EXAMPLES set searches anew each time
    derandomize="CONSUMER_ENGINE_EXAMPLES" not in os.environ,
)  # fmt: skip


def started(
    first: list[Entry], second: list[Entry], *, listener: bool, partitioned: bool, publishes_none: bool
) -> ConsumerWorld:
    """A world whose generator has published once and whose consumer has read it."""
    world = ConsumerWorld(
        [first, second] if partitioned else [first], listener=listener, partitioned=partitioned,
        publishes_none=publishes_none,
    )  # fmt: skip
    world.generator_poll()
    world.read_events(10)
    return world


FINISHES = st.tuples(st.booleans(), st.booleans())
"""How a script ends (`ConsumerWorld.settle`): (elsewhere, marker). Elsewhere: another consumer gets and acknowledges
everything from now on (an inactive Failover consumer, a Shared one that gets nothing more); without a marker the
last event the generator published may be the last one there is (chaos seeds 509827, 509833, 509854)."""


def assert_converges(world: ConsumerWorld, finish: tuple[bool, bool] = (False, True)) -> None:
    """Once everything settled, the consumer's watermark is the fold at the mark-delete position: also when another
    consumer gets everything, and when nothing new is published at the end."""
    elsewhere, marker = finish
    world.settle(elsewhere=elsewhere, marker=marker)
    if not world.added:
        expected = world.fold_now()
        got = world.engine.current
        assert (None if got is None else got.event_time) == expected, (got, expected)


@RELAXED
@given(
    first=logs(),
    second=logs(),
    added=logs(start=0),
    script=actions,
    listener=st.booleans(),
    partitioned=st.booleans(),
    publishes_none=st.booleans(),
    finish=FINISHES,
)
def test_the_engine_against_the_fold_of_the_log(
    first: list[Entry],
    second: list[Entry],
    added: list[Entry],
    script: list[tuple[object, ...]],
    listener: bool,
    partitioned: bool,
    publishes_none: bool,
    finish: tuple[bool, bool],
) -> None:
    world = started(first, second, listener=listener, partitioned=partitioned, publishes_none=publishes_none)
    play(world, script, added)
    assert_converges(world, finish)


idle_actions = st.lists(
    st.one_of(
        st.tuples(st.just("other_take"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("other_take"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("other_ack"), st.integers(0, 3), st.integers(0, 5)),
        st.tuples(st.just("other_ack"), st.integers(0, 3), st.integers(0, 5)),
        st.tuples(st.just("other_ack"), st.integers(0, 3), st.integers(0, 5)),
        st.tuples(st.just("other_give_back"), st.integers(0, 3), st.integers(0, 5)),
        st.tuples(st.just("seek"), st.integers(0, 3), st.integers(-1, 30), st.just("reset")),
        st.tuples(st.just("poll")),
        st.tuples(st.just("poll")),
        st.tuples(st.just("caught_up")),
        st.tuples(st.just("restate")),
        st.tuples(st.just("restate")),
        st.tuples(st.just("read_to_end")),
        st.tuples(st.just("read"), st.integers(1, 5)),
        st.tuples(st.just("read"), st.integers(1, 5)),
        st.tuples(st.just("tick"), st.sampled_from((0.5, 1.0, 2.0, 6.0, 31.0))),
        st.tuples(st.just("generator"), st.booleans()),
        st.tuples(st.just("produce"), st.integers(0, 3), st.integers(0, 400), st.booleans()),
    ),
    max_size=40,
)
"""What may happen while another consumer of the subscription gets every message: no deliveries here."""


@RELAXED
@given(
    first=logs(),
    second=logs(),
    added=logs(start=0),
    before=actions,
    target=st.integers(-1, 30),
    after=idle_actions,
    listener=st.booleans(),
    partitioned=st.booleans(),
    publishes_none=st.booleans(),
    finish=FINISHES,
)
def test_a_seek_by_publish_time_after_which_another_consumer_gets_everything(
    first: list[Entry],
    second: list[Entry],
    added: list[Entry],
    before: list[tuple[object, ...]],
    target: int,
    after: list[tuple[object, ...]],
    listener: bool,
    partitioned: bool,
    publishes_none: bool,
    finish: tuple[bool, bool],
) -> None:
    """Nothing comes to this consumer after its seek by time (another is the active one): it learns where the
    seek landed from the generator alone, and is never premature for what the other consumers still get."""
    world = started(first, second, listener=listener, partitioned=partitioned, publishes_none=publishes_none)
    play(world, before, added)
    for partition in sorted(world.partitions):
        world.seek(partition, target, "time")
    play(world, after, added)
    assert_converges(world, finish)


@RELAXED
@given(
    first=logs(),
    second=logs(),
    added=logs(start=0),
    held_at=st.integers(0, 10),
    acknowledged=st.integers(0, 25),
    back=st.integers(1, 12),
    again=st.integers(1, 4),
    after=actions,
    listener=st.booleans(),
    partitioned=st.booleans(),
    publishes_none=st.booleans(),
    finish=FINISHES,
)
def test_a_reset_back_while_a_newer_event_is_in_flight(
    first: list[Entry],
    second: list[Entry],
    added: list[Entry],
    held_at: int,
    acknowledged: int,
    back: int,
    again: int,
    after: list[tuple[object, ...]],
    listener: bool,
    partitioned: bool,
    publishes_none: bool,
    finish: tuple[bool, bool],
) -> None:
    """Issue 34, fault 1: the consumer holds an event, reads and acknowledges on; the generator publishes a newer
    event that is not read yet when an operator resets the cursor back; what comes again is acknowledged, the
    event read, the reader catches up a second later (the random search found this too rarely to rely on it)."""
    world = started(first, second, listener=listener, partitioned=partitioned, publishes_none=publishes_none)
    partition = sorted(world.partitions)[0]
    for step, count in enumerate((held_at, acknowledged)):
        for _ in range(count):
            world.deliver(partition)
        while world.handed:
            world.ack(0)
        if step == 0:  # the event held; the ones computed after it are published later, in the move
            world.generator_poll()
            world.read_events(len(world.channel))
    world.reset_while_in_flight(partition, back, again)
    play(world, after, added)
    assert_converges(world, finish)


def test_two_resets_back_while_events_are_in_flight() -> None:
    """Found by `test_a_reset_back_while_a_newer_event_is_in_flight` with 2000 fresh examples: E(4) held, a reset back
    to 4, then E(3) in flight while a second reset goes back to 0 (before any W_SET's data at 1000); the fallback
    ended with 1001 computed at 3 while data at 1000 was still to come (pull), or the listener went back to 1000:
    the second reset, seen from entry 0 at or before the held event's position while already distrusting, did not
    bring the frontier back, so the fallback took a fact beyond what came again (failed before; it failed on the
    code before issue 34 too)."""
    first = [Entry("a", 1000, True), Entry("a", 1000, False), Entry("a", 1000, False), Entry("a", 1001, True)]
    first += [Entry("a", 1001, False)] * 11
    world = started(first, [Entry("a", 1000, True)], listener=False, partitioned=False, publishes_none=False)
    for _ in range(5):
        world.deliver(-1)
    while world.handed:
        world.ack(0)
    world.generator_poll()
    world.read_events(len(world.channel))
    world.reset_while_in_flight(-1, 1, 1)
    world.reset_while_in_flight(-1, 4, 1)
    assert_converges(world)


def test_a_seek_by_time_after_a_reset_while_its_event_is_in_flight() -> None:
    """E(3) read after a reset back to 2 (stale), E(2) published for the reset and not read yet, then a seek by
    publish time back to 0: E(2) is read after the seek, is before E(3), the latest read; the seek rule took it as
    computed after the seek (its floor was the latest event read) while 1 (at 1000) was still to come. Found with
    5000 fresh examples (session 15); fixed in session 20, once chaos seed 951483 was traced to the generator."""
    first = [Entry("a", 1000, True), Entry("a", 1000, False), Entry("a", 1001, True)] + [Entry("a", 1001, False)] * 16
    world = started(first, [Entry("a", 1000, True)], listener=False, partitioned=False, publishes_none=False)
    for _ in range(4):
        world.deliver(-1)
    while world.handed:
        world.ack(0)
    world.reset_while_in_flight(-1, 2, 1)
    play(world, [("poll",), ("seek", 0, 0, "time"), ("read_to_end",)], [])
    assert_converges(world, (False, False))


def _seek_by_time_after_moves_back(move: tuple[object, ...], back: tuple[object, ...]) -> None:
    """The shape of two findings: markers at 1000 and 1001 over 18 entries, `move` then `back` (a reset while the
    event of `move` is in flight), half a second, a seek by publish time to 0, everything read: the watermark
    must converge."""
    first = [Entry("a", 1000, True), Entry("a", 1000, False), Entry("a", 1001, True)] + [Entry("a", 1001, False)] * 15
    world = started(first, [Entry("a", 1000, True)], listener=False, partitioned=False, publishes_none=False)
    play(world, [move, back, ("tick", 0.5)], [Entry("a", 0, True)])
    world.seek(-1, 0, "time")
    play(world, [("read_to_end",)], [Entry("a", 0, True)])
    assert_converges(world, (False, False))


def test_a_seek_by_time_while_an_event_before_a_move_back_is_still_awaited() -> None:
    """Found with 5000 fresh examples (session 19). After the seek by id to 4, entry 3 came again (a move back):
    the consumer waits for an event computed before 3. A seek by publish time then took its floor at the latest
    event read (3), so the awaited event (2, at 1001), computed for the move back and read after the seek, passed
    for the seek's own while entry 1 (1000) was still to come. A floor still awaiting its event is a move back
    not settled: the seek then takes no event by position until it has landed (session 20)."""
    _seek_by_time_after_moves_back(("seek", 0, 4, "id"), ("reset_while_in_flight", 0, 1, 1))


@pytest.mark.xfail(
    strict=True,
    reason="open: an operator's reset the consumer could not see (entry 2 came here for the first time), then a seek "
    "by publish time: the generator's event for the reset (2, at 1001), published before the seek and read after "
    "it, is before the latest event read and passes for the seek's, while entry 1 (1000) is still to come (found "
    "with 5000 fresh examples, session 20; the 'unseen reset' class met through a seek by time)",
)
def test_a_seek_by_time_after_a_reset_the_consumer_could_not_see() -> None:
    """Reset to 4 with nothing received, E(3) published; reset back to 2, entry 2 comes (never received here, so no
    move back shows) and is acknowledged, E(3) is read and held; the generator publishes E(2) for the reset. A seek
    by publish time back to 0 takes its floor at E(3); E(2), read after the seek, is before it."""
    _seek_by_time_after_moves_back(("seek", 0, 4, "reset"), ("reset_while_in_flight", 0, 2, 1))


def test_an_event_from_before_a_reset_read_late_does_not_say_the_consumer_saw_the_reset() -> None:
    """Found with 5000 fresh examples (session 15): after a reset back to entry 1, the event computed at entry 0
    before it (1000, the fold there too) was read late, then one computed at 3 before it (1001); the generator's
    recomputed event at 1 (1000) took the watermark back. The move back came only through a second copy of a
    message this consumer still held (acknowledged elsewhere), which no consumer can tell from a redelivery; the
    event at 1 says it. The world took the late 1000 as the consumer holding the fold after the move: only an
    event the generator published since the move says that (`ConsumerWorld.since_move`)."""
    first = [Entry("a", 1000, True), Entry("a", 1000, False), Entry("a", 1000, True), Entry("a", 1001, True)]
    first += [Entry("a", 1001, False)] * 19
    world = started(first, [Entry("a", 1000, True)], listener=True, partitioned=False, publishes_none=False)
    play(world, [("deliver", 0, 4), ("poll",), ("copy_acknowledged_elsewhere", 0), ("reset_while_in_flight", 0, 3, 1)],
         [Entry("a", 0, True)])  # fmt: skip
    assert_converges(world, (False, False))
