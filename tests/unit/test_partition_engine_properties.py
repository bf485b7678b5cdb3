"""Properties of the partition engine over random runs (hypothesis), on the simulated partition.

A run is a script of what happens to a partition: producers write markers and data, ledgers roll
over, the owner is delivered entries (some twice), subscriptions acknowledge, seek back, go away
and come back, the cursors are polled, time passes, and other instances take the partition over.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker_ext.engine import EngineConfig, Following, recovery
from tests.unit.partition_world import World
from watermark_core.protocol import Position, entry_end
from watermark_core.state import WatermarkState

pytestmark = pytest.mark.unit

RELAXED = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])

PRODUCERS = ("p1", "p2", "p3")
SUBSCRIPTIONS = ("s1", "s2")

Step = tuple[str, ...] | tuple[str, int] | tuple[str, str, int] | tuple[str, str, float]

steps = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(PRODUCERS), st.integers(0, 1_000)),
    st.tuples(st.just("set"), st.sampled_from(PRODUCERS), st.integers(0, 1_000)),
    st.tuples(st.just("deliver"), st.integers(1, 20)),
    st.tuples(st.just("ack"), st.sampled_from(SUBSCRIPTIONS), st.floats(0.5, 1)),
    st.tuples(st.just("poll")),
    st.tuples(st.just("idle"), st.sampled_from(PRODUCERS)),
    st.tuples(st.just("data"), st.sampled_from(PRODUCERS), st.integers(0, 1_000)),
    st.tuples(st.just("roll")),
    st.tuples(st.just("deliver"), st.integers(1, 6)),
    st.tuples(st.just("redeliver"), st.integers(1, 3)),
    st.tuples(st.just("ack"), st.sampled_from(SUBSCRIPTIONS), st.floats(0, 1)),
    st.tuples(st.just("seek"), st.sampled_from(SUBSCRIPTIONS), st.floats(0, 1)),
    st.tuples(st.just("drop"), st.sampled_from(SUBSCRIPTIONS)),
    st.tuples(st.just("poll")),
    st.tuples(st.just("tick"), st.sampled_from((0.1, 0.5, 3.0, 11.0))),
    st.tuples(st.just("takeover")),
    st.tuples(st.just("seek"), st.sampled_from(SUBSCRIPTIONS), st.floats(0, 0.3)),
    st.tuples(st.just("report"), st.integers(0, 6)),
)


@dataclass
class Run:
    """One scripted run: its world and the positions of the entries the script wrote (snapshots aside)."""

    world: World
    written: list[Position]

    def position(self, fraction: float) -> tuple[int, int]:
        """A mark-delete position among what was written: the fraction of the way through, or before it all."""
        if not self.written:
            return (min(self.world.ledgers), -1)
        index = int(fraction * len(self.written)) - 1
        if index < 0:
            first = self.written[0]
            return (first[0], first[1] - 1)
        return self.written[index][:2]


def play(
    script: list[Step],
    takeovers: frozenset[int] = frozenset(),
    interval: int = 3,
    limit: int = 10_000,
    after_each: Callable[[World], None] | None = None,
) -> Run:
    """`limit`: the engine's marker_log_limit (a small one leaves subscriptions behind to be rebuilt); `after_each`
    looks at the world after every step."""
    config = EngineConfig(snapshot_interval_messages=interval, snapshot_interval_s=5.0, marker_log_limit=limit)
    world = World(config=config)
    run = Run(world, [])
    world.own(world.engine())
    for index, step in enumerate(script):
        if index in takeovers:
            world.own(world.engine())
        kind = step[0]
        if kind == "set":
            run.written.append(world.w_set(str(step[1]), int(step[2])))
        elif kind == "idle":
            run.written.append(world.w_idle(str(step[1])))
        elif kind == "data":
            run.written.append(world.data(str(step[1]), int(step[2])))
        elif kind == "roll":
            world.roll()
        elif kind == "deliver":
            world.deliver(int(step[1]))
        elif kind == "report":
            world.report(int(step[1]))
        elif kind == "listed":
            world.deliver_listed(int(step[1]))
        elif kind == "redeliver":
            world.redeliver(int(step[1]))
            world.deliver(int(step[1]))
        elif kind == "ack":
            name, wanted = str(step[1]), run.position(float(step[2]))
            world.subscriptions[name] = max(world.subscriptions.get(name, wanted), wanted)
        elif kind == "seek":
            world.subscriptions[str(step[1])] = run.position(float(step[2]))
        elif kind == "drop":
            world.subscriptions.pop(str(step[1]), None)
        elif kind == "poll":
            world.poll()
        elif kind == "tick":
            world.tick(float(step[1]))
        elif kind == "takeover":
            world.own(world.engine())
        if after_each is not None:
            after_each(world)
    return run


def check_every_value_published(world: World) -> None:
    """Every published watermark is the fold of the log up to the position it is published at."""
    for _, event in world.tables:
        assert event.event_time == world.watermark_at(event.position), event
    for told in world.head_watermarks:
        assert told.watermark == world.truth(told.position).watermark, told


def final_values(run: Run) -> dict[str, int | None]:
    """Once everything is delivered and polled: each subscription's latest published watermark."""
    run.world.settle()
    return {
        name: (event.event_time if (event := run.world.latest(name)) is not None else None)
        for name in sorted(run.world.subscriptions)
    }


@RELAXED
@given(st.lists(steps, max_size=60), st.sampled_from((10_000, 3, 1)))
def test_a_published_watermark_is_the_fold_of_the_log_up_to_its_position(script: list[Step], limit: int) -> None:
    run = play(script, limit=limit)
    check_every_value_published(run.world)
    finals = final_values(run)
    check_every_value_published(run.world)
    for name, value in finals.items():
        truth = run.world.watermark_at(run.world.subscriptions[name])
        assert value == truth, (name, run.world.subscriptions[name])


@RELAXED
@given(st.lists(steps, max_size=60), st.sampled_from((10_000, 2)))
@example(  # two owners' tables at one `seq` (the rig's clock stood still): the rig took the older for the latest
    [("set", "p1", 0), ("ack", "s1", 1.0), ("deliver", 1), ("set", "p1", 1), ("takeover",), ("ack", "s1", 1.0)], 10_000
)
def test_the_latest_table_names_every_subscription_with_a_watermark(script: list[Step], limit: int) -> None:
    """Issue #26 (2): compaction keeps only the latest table, so it must hold every subscription's value."""
    run = play(script, limit=limit)
    run.world.settle()
    for name, mark_delete in run.world.subscriptions.items():
        truth = run.world.watermark_at(mark_delete)
        if truth is not None:
            event = run.world.latest_table_holds(name)
            assert event is not None and event.event_time == truth, (name, mark_delete)


@RELAXED
@given(
    st.lists(steps, max_size=60),
    st.frozensets(st.integers(0, 40), max_size=3),
    st.integers(2, 6),
    st.sampled_from((10_000, 2)),
)
def test_taking_over_at_any_point_then_continuing_equals_an_uninterrupted_run(
    script: list[Step], takeovers: frozenset[int], interval: int, limit: int
) -> None:
    uninterrupted = play(script, interval=interval)
    taken_over = play(script, takeovers, interval=interval, limit=limit)
    check_every_value_published(taken_over.world)
    assert final_values(taken_over) == final_values(uninterrupted)
    check_every_value_published(taken_over.world)
    heads = [run.world.delivery.engine.phase for run in (uninterrupted, taken_over) if run.world.delivery]
    states = [p.head for p in heads if isinstance(p, Following)]
    if len(states) == 2:
        assert (states[0].watermark, states[0].producers) == (states[1].watermark, states[1].producers)


def unbatched(script: list[Step]) -> list[Step]:
    """The script with each plugin answer (`report`) handed as the same entries one by one, then the cursors."""
    out: list[Step] = []
    for step in script:
        out.extend([("listed", step[1]), ("poll",)] if step[0] == "report" else [step])
    return out


@RELAXED
@given(st.lists(steps, max_size=60), st.integers(2, 6), st.sampled_from((10_000, 2)))
@example([("set", "p1", 5), ("report", 3), ("set", "p1", 7), ("ack", "s1", 1.0), ("report", 3)], 3, 10_000)
@example([("set", "p1", 0), ("report", 2), ("set", "p1", 1), ("deliver", 1)], 2, 10_000)  # CI, session 32: the rig
# delivered one by one the snapshot record the take-over wrote meanwhile, which the answer did not list
def test_an_answer_handed_as_one_event_publishes_what_its_entries_and_cursors_handed_one_by_one_do(
    script: list[Step], interval: int, limit: int
) -> None:
    """Issue 47: a plugin's answer is one `Reported` event; by the end of each step every subscription's latest
    published watermark, and the head's latest watermark told, are those of its entries and then the cursors handed
    as events of their own. How many tables and head events it took may differ: the rig answers the engine's requests
    between two events, and a snapshot cut after an answer states a later position than one cut between its entries
    (a take-over from it tells the head's watermark there again). Every one told is the fold of the log."""

    def published(steps: list[Step]) -> tuple[Run, list[object]]:
        seen: list[object] = []

        def look(world: World) -> None:
            latest = {e.subscription: (e.event_time, e.position) for _, e in world.tables}
            seen.append((latest, world.head_watermarks[-1].watermark if world.head_watermarks else None))

        return play(steps, interval=interval, limit=limit, after_each=look), seen

    batched, by_step = published(script)
    one_by_one, by_substep = published(unbatched(script))
    ends = list(itertools.accumulate(2 if step[0] == "report" else 1 for step in script))  # each step's last substep
    assert by_step == [by_substep[end - 1] for end in ends]
    check_every_value_published(batched.world)  # tables and head watermarks
    assert final_values(batched) == final_values(one_by_one)


def same_state(state: WatermarkState, truth: WatermarkState) -> bool:
    return (state.watermark, state.clock, dict(state.producers), dict(state.pending_txns)) == (
        truth.watermark, truth.clock, dict(truth.producers), dict(truth.pending_txns)
    )  # fmt: skip


def check_every_state_is_the_fold(world: World) -> None:
    """The head, the marker log's base and every subscription hold the fold of the log up to where they stand."""
    engine = world.delivery.engine if world.delivery else None
    if engine is None or not isinstance(engine.phase, Following):
        return
    f = engine.phase
    assert same_state(f.head, world.truth(f.log.head_position))
    assert same_state(f.log.base, world.truth(f.log.base_position))
    for tracker in f.trackers.values():
        if not tracker.rebuilding:
            assert same_state(tracker.state, world.truth(tracker.applied_to)), tracker.name


@RELAXED
@given(st.lists(steps, max_size=60), st.frozensets(st.integers(0, 40), max_size=2), st.sampled_from((10_000, 2)))
def test_every_subscription_and_the_logs_base_hold_the_fold_of_the_log_up_to_where_they_stand(
    script: list[Step], takeovers: frozenset[int], limit: int
) -> None:
    """A subscription that reaches the head takes the head's state, and a trim takes a subscription's state, instead
    of folding the same markers again: sound only while every state is the whole fold up to its position."""
    run = play(script, takeovers, limit=limit, after_each=check_every_state_is_the_fold)
    run.world.settle()
    check_every_state_is_the_fold(run.world)


@RELAXED
@given(st.lists(steps, max_size=40))
def test_an_engine_asks_for_a_tick_only_while_it_has_something_to_do(script: list[Step]) -> None:
    run = play(script)
    run.world.settle()
    engine = run.world.delivery.engine if run.world.delivery else None
    assert engine is not None
    if isinstance(engine.phase, Following):
        assert engine.phase.messages_since_snapshot == 0 or engine.wakeup_at is not None
        for tracker in engine.trackers.values():
            assert not tracker.rebuilding
            assert tracker.applied_to <= entry_end(*run.world.subscriptions[tracker.name])


@RELAXED
@given(
    st.lists(st.tuples(st.sampled_from(("set", "idle", "data", "roll")), st.sampled_from(PRODUCERS),
                       st.integers(0, 1_000)), min_size=5, max_size=60),
    st.lists(st.floats(0, 1), min_size=1, max_size=4),
    st.integers(2, 5),
)  # fmt: skip
def test_a_new_owner_rebuilds_the_state_at_any_earlier_position_through_the_snapshot_chain(
    writes: list[tuple[str, str, int]], seeks: list[float], interval: int
) -> None:
    """A new owner knows only the snapshots delivered after the cursor: earlier ones it finds by the chain."""
    script: list[Step] = []
    for kind, producer, value in writes:  # read as written, so the snapshots land in between
        script += [(kind, producer, value) if kind != "roll" else ("roll",), ("deliver", 10)]
    run = play([*script, ("tick", 11.0), ("deliver", 1_000)], interval=interval)
    run.world.settle()
    run.world.own(run.world.engine())
    run.world.settle()
    for fraction in seeks:
        run.world.subscriptions["s1"] = run.position(fraction)
        run.world.settle()
        event = run.world.latest("s1")
        truth = run.world.watermark_at(run.world.subscriptions["s1"])
        assert (event.event_time if event else None) == truth
    check_every_value_published(run.world)


@RELAXED
@given(
    st.lists(st.tuples(st.sampled_from(("set", "set", "idle", "data", "data", "roll")), st.sampled_from(PRODUCERS),
                       st.integers(0, 1_000)), min_size=10, max_size=80),
    st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=2, max_size=6),
    st.integers(1, 4),
    st.integers(1, 3),
)  # fmt: skip
def test_a_subscription_far_behind_moving_in_steps_gets_the_fold_of_the_log_at_each_with_a_small_catalog(
    writes: list[tuple[str, str, int]], moves: list[tuple[float, bool]], keep: int, keep_walked: int
) -> None:
    """A query's new subscription at an early position, acknowledging forward in steps (and now and then
    back): few snapshots kept, so its rebuilds walk the chain, and what walks find kept thinned hard
    (recovery.KEEP_WALKED). Now and then the ledgers every cursor passed are deleted (no retention).
    Each step's watermark is the fold of the log there."""
    script: list[Step] = []
    for kind, producer, value in writes:
        script += [(kind, producer, value) if kind != "roll" else ("roll",), ("deliver", 10)]
    with mock.patch.object(recovery, "KEEP_SNAPSHOTS", keep), mock.patch.object(recovery, "KEEP_WALKED", keep_walked):
        run = play([*script, ("tick", 11.0), ("deliver", 1_000)], interval=2)
        run.world.settle()
        deleted = False
        for fraction, delete_passed in moves:
            target = run.position(fraction)
            if deleted:  # what was deleted cannot be moved back to
                target = max(target, run.world.subscriptions["query"])
            run.world.subscriptions["query"] = target
            if delete_passed:
                deleted = True
                lowest = min(run.world.generator_cursor, *run.world.subscriptions.values())
                for ledger in [ledger for ledger in run.world.ledgers if ledger < lowest[0]]:
                    run.world.delete_ledger(ledger)
            run.world.settle()
            event = run.world.latest("query")
            truth = run.world.watermark_at(run.world.subscriptions["query"])
            assert (event.event_time if event else None) == truth, run.world.subscriptions["query"]
    check_every_value_published(run.world)
