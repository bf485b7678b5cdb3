"""The per-partition engine without a broker: take-over, rebuilds, subscriptions, publishing (pure).

Each case names the broker test or finding it mirrors. The partition is simulated by
tests/unit/partition_world.py, which carries out the engine's commands against a log of its own.
"""

from __future__ import annotations

import pytest

from broker_ext.engine import AwaitingCursor, EngineConfig, Following, PartitionEngine, TakingOver, Unowned, recovery
from broker_ext.engine.marker_log import MarkerLog
from broker_ext.engine.recovery import BEFORE_EVERYTHING, KEEP_SNAPSHOTS, ledger_start, normalized_cursor
from broker_ext.engine.vocabulary import (
    AcknowledgeUpTo,
    BrokenAssertion,
    ClaimIncarnation,
    CursorsPolled,
    EntryRead,
    HeadWatermark,
    IncarnationRead,
    MarkerFolded,
    MarkerMalformed,
    PollCursors,
    PublishTable,
    RangeRead,
    RawMarker,
    ReadIncarnation,
    ReadLag,
    ReadMarkerAt,
    ReadRange,
    SnapshotWritten,
    SubscriptionRemoved,
    Tick,
    UnusableSnapshot,
    WriteSnapshot,
)
from tests.unit.partition_world import TOPIC, World, ack, ack_all, before_entry
from watermark_core.protocol import MARKER_PROPERTY, Marker, MarkerKind, decode_marker, encode_set, entry_end
from watermark_core.state import WatermarkState

pytestmark = pytest.mark.unit


def of(world: World, kind: type) -> list:  # type: ignore[type-arg]
    return [c for c in world.commands if isinstance(c, kind)]


def following(engine: PartitionEngine) -> Following:
    assert isinstance(engine.phase, Following), engine.phase
    return engine.phase


def first_owner(world: World) -> PartitionEngine:
    """An engine that owns the partition and has read everything so far."""
    engine = world.engine()
    world.own(engine)
    world.settle()
    return engine


# -- taking over --------------------------------------------------------------------------------------


def test_the_first_entry_delivered_makes_the_engine_the_owner_and_it_asks_for_the_cursor() -> None:
    world = World()
    world.w_set("A", 100)
    engine = world.engine()
    world.hold = {PollCursors}
    world.own(engine)
    world.deliver()
    assert isinstance(engine.phase, AwaitingCursor)
    assert engine.owner and engine.wants_cursors
    assert of(world, PollCursors) == [PollCursors()]
    world.release(engine)
    assert isinstance(engine.phase, Following)


def test_no_snapshot_yet_and_the_first_entry_the_oldest_ledgers_first_nothing_before_it_is_read() -> None:
    """Mirrors test_generator's first test: a fresh topic. Its first entry delivered is its oldest ledger's
    first, so the state before it is the initial one: no reader per partition to learn that (bench scale's
    take-over spent 4 s of 1000 partitions' on such reads)."""
    world = World()
    world.w_set("B", 50)
    world.w_set("A", 100)
    engine = first_owner(world)
    assert of(world, ReadRange) == [] and of(world, ReadMarkerAt) == []
    assert following(engine).head.watermark == 50
    ack_all(world, "fast")
    world.settle()
    assert world.latest("fast") is not None and world.latest("fast").event_time == 50  # type: ignore[union-attr]


def test_with_the_ledgers_unknown_the_state_before_the_first_entry_is_read_from_the_start() -> None:
    """A cursor answer that lists no ledgers proves nothing about what precedes the first entry: it is read."""
    world = World(list_ledgers=False)
    world.w_set("A", 100)
    engine = first_owner(world)
    assert of(world, ReadRange)[0].start == BEFORE_EVERYTHING
    assert following(engine).head.watermark == 100


def test_a_new_owner_restores_from_the_snapshot_at_the_generators_cursor_without_reading_the_log() -> None:
    """Mirrors test_kill_9_of_the_generator_mid_stream_then_restart ("restored from the snapshot")."""
    world = World()
    first = first_owner(world)
    for i in range(10):
        world.w_set("A", 100 + i)
        world.data("A", 100 + i)
    world.settle()
    assert of(world, AcknowledgeUpTo), "the first owner moved its cursor to a snapshot"
    cursor = world.generator_cursor
    world.w_set("A", 500)
    successor = world.engine()
    world.commands.clear()
    world.own(successor)
    world.settle()
    assert of(world, ReadRange) == [] and of(world, ReadMarkerAt) == []
    assert world.generator_cursor >= cursor
    head, truth = following(successor).head, world.truth(following(successor).log.head_position)
    assert (head.watermark, head.producers, head.clock) == (truth.watermark, truth.producers, truth.clock)
    assert head.watermark == 500
    assert isinstance(first.phase, Unowned)


def test_a_take_over_whose_delivery_starts_after_a_gap_is_not_restored_across_it() -> None:
    """Chaos, session 27 (seeds 224348, 224399, 224468, a standby taking over): the first owner's periodic snapshot
    moved the generator's cursor inside the broker, so the plugin handed the standby only what came after it (the
    ledger-start snapshot, then that periodic one); the cursor the standby had been told was the older one (the
    ledger's start). It restored from the ledger-start snapshot, and the entries between were never folded:
    watermarks withdrawn, one premature. A delivered snapshot is restored from only where it states the position
    just before the first entry delivered; else the state there is rebuilt from the log."""
    world = World(config=EngineConfig(snapshot_interval_messages=1_000, snapshot_interval_s=1e9))  # no periodic one
    world.w_set("A", 100)
    world.w_set("B", 200)
    first_owner(world)
    snapshots = [e.position for e in world.ledgers[10] if e.marker and e.marker.kind is MarkerKind.W_SNAPSHOT]
    assert snapshots and world.generator_cursor == (-1, -1), "the first owner wrote the ledger's start state only"
    world.w_set("A", 300)
    successor = world.engine()
    world.commands.clear()
    world.own(successor)
    world.delivery.after = (*before_entry(snapshots[0]), -1)  # type: ignore[union-attr]  # the gap
    world.settle()
    head, truth = following(successor).head, world.truth(following(successor).log.head_position)
    assert (head.watermark, head.producers) == (truth.watermark, truth.producers)
    assert head.watermark == 200
    assert of(world, ReadRange), "the entries before the first one delivered were read from the log"


def test_a_cursor_at_next_ledger_minus_one_folds_the_entries_of_the_ledger_before_it() -> None:
    """Mirrors the fix in RELIABILITY ("(next ledger, -1)" after a broker restart): markers written just before
    the restart were never delivered to the generator, its cursor now names the next ledger."""
    world = World()
    world.w_set("A", 100)
    world.w_set("B", 300)
    world.w_idle("A")  # never delivered to a generator
    ledger = world.roll()
    world.generator_cursor = (ledger, -1)
    world.data("B", 400)
    world.w_set("B", 600)
    assert normalized_cursor((ledger, -1), [(10, 3), (ledger, 2)]) == (10, 2)
    engine = first_owner(world)
    assert following(engine).head.watermark == 600  # A idle: only B holds it
    reads = of(world, ReadRange)
    assert reads and reads[0].start == BEFORE_EVERYTHING and reads[0].stop == ledger_start(ledger)
    starts = [w.state.position for w in of(world, WriteSnapshot) if not w.periodic]
    assert ledger_start(ledger) in starts, "delivery started at a ledger's first entry: its start state is written"


def test_with_no_snapshot_at_the_cursor_the_nearest_one_known_is_read_on_from_not_trusted_as_is() -> None:
    """The old worker restored the newest delivered snapshot as it was ("no snapshot matches the cursor")
    and missed the markers between its stated position and the cursor; the engine reads them."""
    world = World()
    world.w_set("A", 100)
    world.w_set("B", 200)
    at = world.w_set("A", 150)  # (10, 2)
    world.w_idle("A")  # (10, 3): between the snapshot's position and the cursor
    world.data("B", 210)  # (10, 4)
    world.generator_cursor = (10, 4)
    world.data("B", 220)  # (10, 5): delivery starts here
    world.snapshot_record(world.truth(at).advanced_to(at), None, "__wm_generator-old")  # late, states (10, 2)
    engine = first_owner(world)
    read = of(world, ReadRange)[0]
    assert (read.start, read.stop) == (at, entry_end(10, 4))
    assert following(engine).head.watermark == 200  # A idle at (10, 3); 150 if that marker were missed


def test_a_delivery_that_pauses_ends_the_search_for_a_snapshot() -> None:
    world = World()
    world.w_set("A", 100)
    world.data("A", 100)
    world.generator_cursor = (10, 0)
    ledgers = tuple((lid, len(e)) for lid, e in world.ledgers.items())
    engine = world.engine()
    engine.handle(EntryRead((10, 1, -1), None, "A", 100), world.now)
    engine.handle(CursorsPolled({}, (10, 0), (10, 5), ledgers), world.now)  # the tail is further on
    engine.handle(IncarnationRead(None), world.now)
    assert isinstance(engine.phase, TakingOver)
    assert engine.wakeup_at == pytest.approx(world.now + engine.config.takeover_idle_s)
    commands = engine.handle(EntryRead((10, 2, -1), None, "A", 100), world.now + 0.1)
    assert not any(isinstance(c, ReadRange) for c in commands)
    world.now += 0.5
    world.send(engine, Tick())
    assert isinstance(engine.phase, Following)


def test_ledger_start_snapshots_are_written_when_reading_enters_a_new_ledger() -> None:
    """Mirrors PROTOCOL's ledger-start snapshots (seed 7007's fix)."""
    world = World()
    engine = first_owner(world)
    world.w_set("A", 100)
    world.settle()
    ledger = world.roll()
    world.data("A", 120)
    world.commands.clear()
    world.deliver()
    start = [w for w in of(world, WriteSnapshot) if not w.periodic]
    assert [w.state.position for w in start] == [ledger_start(ledger)]
    assert start[0].state.watermark == 100
    assert AcknowledgeUpTo(ledger_start(ledger)) not in world.commands, "it states an earlier position: no ack"
    assert following(engine).log.head_position[0] == ledger


def test_each_snapshot_names_the_one_written_before_it_and_one_is_written_at_a_time() -> None:
    """Mirrors "each snapshot names the one written before it (from send's message id)"."""
    world = World()
    world.hold = {WriteSnapshot}
    engine = first_owner(world)
    world.w_set("A", 100)
    world.roll()
    world.data("A", 100)
    world.roll()
    world.data("A", 100)
    world.deliver()
    assert len(of(world, WriteSnapshot)) == 1, "one outstanding write at a time"
    written = []
    while world.held:
        command = world.held.pop(0)
        assert isinstance(command, WriteSnapshot)
        assert command.previous == (written[-1] if written else None)
        written.append(world.snapshot_record(command.state, command.previous, "__wm_generator-world"))
        world.send(engine, SnapshotWritten(written[-1]))
    assert len(written) == 3


def test_a_take_over_after_deleted_ledgers_folds_from_the_ledger_start_snapshot_it_reads_not_from_nothing() -> None:
    """A new owner's delivery pauses before the snapshot at the generator's cursor, so its search ends (after
    `takeover_idle_s`) and it folds the partition from its start; Pulsar deleted the ledger before the current one
    (no retention), so that fold begins at the first entry left. It starts from the ledger-start snapshot it reads
    there: from nothing, it left out a producer that asserted only in the deleted ledger (premature: 5000, not
    1000)."""
    world = World(config=EngineConfig(snapshot_interval_messages=1_000))  # no periodic snapshot of the old owner's
    first_owner(world)
    world.w_set("p0", 1_000)
    world.w_set("p3", 1_000)
    world.deliver()
    deleted = world.ledger
    world.roll()
    world.w_set("p0", 5_000)
    world.data("p3", 2_000)
    world.deliver()  # entering the new ledger: its ledger-start snapshot is written there
    cursor = world.data("p3", 2_100)
    world.data("p3", 2_200)  # written before the snapshot stating `cursor` was
    world.snapshot_record(world.truth(cursor), None, "__wm_generator-old")  # a periodic one
    world.generator_cursor = cursor[:2]
    world.delete_ledger(deleted)
    new = world.engine()
    world.own(new)
    world.deliver(1)  # the entry after the cursor; then delivery pauses before the snapshot
    world.tick(1.0)
    assert isinstance(new.phase, Following)
    assert world.truth(cursor).watermark == 1_000
    assert new.head is not None and new.head.watermark == 1_000
    assert all(h.watermark != 5_000 for h in world.head_watermarks if h.position > cursor)


def test_markers_come_raw_from_the_shells_and_the_engine_decodes_them_a_malformed_one_followed_as_data() -> None:
    """Issue 47: one decoder, in the engine; the shell only counts and logs what `MarkerMalformed` names."""
    world = World()
    world.w_set("p", 500)
    engine = first_owner(world)
    ledger, last = world.last_confirmed()
    at, after = (ledger, last + 1, -1), (ledger, last + 2, -1)
    commands = engine.handle(EntryRead(at, raw=RawMarker("W_SET", encode_set(1_000), "p", at, 5)), world.now)
    assert MarkerFolded(at) in commands and engine.head is not None and engine.head.watermark == 1_000
    commands = engine.handle(EntryRead(after, raw=RawMarker("W_SET", b"\xc1", "p", after, 6)), world.now)
    (malformed,) = [c for c in commands if isinstance(c, MarkerMalformed)]
    assert malformed.producer == "p" and malformed.position == after
    assert engine.head_position == after and engine.head.watermark == 1_000  # passed as data


def test_a_periodic_snapshot_moves_the_cursor_only_once_it_is_written() -> None:
    """DECISIONS: the generator's cursor moves only to the stated position of a snapshot it has written."""
    world = World(config=EngineConfig(snapshot_interval_messages=3))
    engine = first_owner(world)
    world.hold = {WriteSnapshot}
    for i in range(3):
        world.w_set("A", i)
    world.deliver()
    assert of(world, AcknowledgeUpTo) == []
    world.hold = set()
    world.release(engine)
    acks = of(world, AcknowledgeUpTo)
    assert acks == [AcknowledgeUpTo((10, 2, -1))]


# -- rebuilding from snapshots --------------------------------------------------------------------------


def test_a_subscription_far_behind_is_rebuilt_from_the_nearest_snapshot_before_it() -> None:
    """Mirrors test_a_subscription_created_at_earliest_on_a_topic_with_snapshots."""
    world = World(config=EngineConfig(snapshot_interval_messages=5))
    engine = first_owner(world)
    positions = []
    for i in range(30):
        positions.append(world.w_set("E", 10_000 + i))
        world.data("E", 10_000 + i)
        world.settle()
    assert following(engine).log.base_position > positions[10]
    ack(world, "late", positions[10])
    world.commands.clear()
    world.settle()
    read = of(world, ReadRange)[0]
    assert BEFORE_EVERYTHING < read.start <= positions[10]
    assert world.latest("late").event_time == 10_010  # type: ignore[union-attr]


def test_the_chain_walk_reads_back_to_the_nearest_snapshot_before_the_target() -> None:
    """A new owner knows only the snapshots delivered to it; older ones are found through `previous`."""
    world = World(config=EngineConfig(snapshot_interval_messages=4))
    first_owner(world)
    positions = []
    for i in range(24):
        positions.append(world.w_set("A", i * 10))
        world.settle()
    successor = world.engine()
    world.own(successor)
    world.settle()
    known = len(successor.catalog)
    ack(world, "sub", positions[3])
    world.commands.clear()
    world.settle()
    walked = of(world, ReadMarkerAt)
    assert walked, f"the chain was walked back (the new owner knew {known} snapshots)"
    read = of(world, ReadRange)[0]
    assert BEFORE_EVERYTHING < read.start <= positions[3], "from the snapshot nearest before it, not the start"
    assert world.latest("sub").event_time == 30  # type: ignore[union-attr]


def test_a_subscription_far_behind_that_moves_forward_walks_the_snapshot_chain_once() -> None:
    """A query's new subscription at the start of a long backlog acknowledges it in steps (one per batch).

    Every step is a rebuild (the marker log does not reach back there); walking the chain back again
    for each one read hundreds of snapshots per step and halved the broker's reads for the query itself
    (docs/DECISIONS.md, the steady rate). The snapshots a walk found are kept, so later steps start near.
    """
    world = World(config=EngineConfig(snapshot_interval_messages=2))
    first_owner(world)
    positions = []
    for i in range(KEEP_SNAPSHOTS * 3):
        positions.append(world.w_set("E", 10_000 + i))
        world.data("E", 10_000 + i)
        world.settle()
    ack(world, "query", positions[5])
    world.settle()
    assert of(world, ReadMarkerAt), "the first rebuild walks the chain back"
    assert world.latest("query").event_time == 10_005  # type: ignore[union-attr]
    for step in (40, 90, 150):
        world.commands.clear()
        ack(world, "query", positions[step])
        world.settle()
        assert not of(world, ReadMarkerAt), f"step to {step}: the chain was walked again"
        read = of(world, ReadRange)[0]
        assert positions[step - 10] < read.start <= positions[step], f"step to {step}: read from {read.start}"
        assert world.latest("query").event_time == 10_000 + step  # type: ignore[union-attr]


def test_a_kept_snapshot_in_a_deleted_ledger_is_dropped_and_the_chain_walked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A walk's snapshots are kept thinned: the nearest one kept before a later target can lie in a ledger
    deleted since, while the ledger-start snapshot of the target's own ledger was thinned away. The
    refused rebuild drops the kept snapshots of that ledger, so the retry walks the chain (no stuck watermark)."""
    monkeypatch.setattr(recovery, "KEEP_WALKED", 4)  # thin hard: ledger-start snapshots are dropped
    world = World(config=EngineConfig(snapshot_interval_messages=2))
    first_owner(world)
    positions = []
    for i in range(KEEP_SNAPSHOTS + 60):
        if i == 80:
            old = world.ledger
            world.roll()
        positions.append(world.w_set("E", 10_000 + i))
        world.data("E", 10_000 + i)
        world.settle()
    ack(world, "slow", positions[5])
    world.settle()
    assert world.latest("slow").event_time == 10_005  # type: ignore[union-attr]
    world.delete_ledger(old)  # every cursor passes it: the generator's, and the slow one's next step
    ack(world, "slow", positions[80])  # the new ledger's first entry
    for _ in range(8):
        world.tick(11.0)  # the retries' back-off
        world.settle()
    assert world.latest("slow").event_time == 10_080  # type: ignore[union-attr]


def test_a_rebuild_from_the_start_after_an_entry_read_before_is_refused() -> None:
    """Mirrors test_restarts / seed 7007: Pulsar deleted the ledger the engine read first, and no snapshot
    covers it (here: none was ever written); a fold from the start begins after it and is not used."""
    world = World(config=EngineConfig(snapshot_interval_messages=2))
    world.hold = {WriteSnapshot}  # snapshots never land
    engine = first_owner(world)
    world.w_set("p0", 1_000)
    world.w_set("p3", 1_000)
    world.w_idle("p3")
    world.w_set("p3", 1_000)
    first_ledger = world.ledger
    world.roll()
    world.w_set("p0", 5_000)
    seek_to = world.data("p3", 2_000)
    for _ in range(4):
        world.data("p3", 2_000)
    world.deliver()
    world.delete_ledger(first_ledger)
    ack(world, "sub", seek_to)
    world.poll()
    assert world.refused and "deleted" in world.refused[0].reason
    assert world.latest("sub") is None, "nothing published: late, never premature"
    assert engine.trackers["sub"].rebuilding
    assert engine.wakeup_at is not None, "retried later"


def test_a_rebuild_that_leaves_a_deleted_snapshot_ledger_at_once_is_refused() -> None:
    """The nearest snapshot states a position in a ledger deleted since: a reader opened there begins in the
    next ledger, and the markers after the snapshot in the deleted one are gone."""
    world = World(config=EngineConfig(snapshot_interval_messages=4))
    world.hold = {WriteSnapshot}  # no snapshot of ours lands (no ledger-start snapshot of the next ledger)
    world.w_set("A", 100)
    at = world.w_set("B", 300)
    world.snapshot_record(world.truth(at).advanced_to(at), None, "__wm_generator-old")
    world.w_idle("A")  # after the snapshot, in the ledger that goes
    old = world.ledger
    world.roll()
    target = world.data("B", 310)
    for i in range(6):
        world.data("B", 320 + i)
    engine = first_owner(world)
    assert following(engine).log.base_position > target
    world.delete_ledger(old)
    ack(world, "sub", target)
    world.commands.clear()
    world.poll()
    reads = of(world, ReadRange)
    assert reads and reads[0].start == at
    assert world.refused and f"ledger {old} was deleted" in world.refused[-1].reason
    assert world.latest("sub") is None


def test_a_rebuilt_state_with_a_watermark_above_the_heads_is_refused() -> None:
    """Mirrors seed 7007 in a generator that never read the deleted ledger: its chain ends in it, the fold
    from the partition's start misses p3's markers and says 5000 where the log says 1000."""
    world = World()
    world.w_set("p0", 1_000)
    world.w_set("p3", 1_000)
    world.w_idle("p3")
    gone = world.w_set("p3", 1_000)
    old = world.ledger
    world.roll()
    world.w_set("p0", 5_000)
    target = world.data("p3", 2_000)
    at = world.data("p3", 2_000)
    world.snapshot_record(world.truth(at).advanced_to(at), gone, "__wm_generator-old")
    world.generator_cursor = at[:2]
    world.delete_ledger(old)
    engine = first_owner(world)
    assert following(engine).head.watermark == 1_000
    ack(world, "sub", target)
    world.poll()
    assert of(world, ReadMarkerAt)[0].position == gone
    assert world.refused and "above the watermark 1000" in world.refused[0].reason
    assert world.latest("sub") is None


# -- subscriptions --------------------------------------------------------------------------------------


def test_a_subscription_that_moves_back_is_recomputed_and_forward_again() -> None:
    """Mirrors test_seek_back_recomputes_the_watermark_and_seek_forward_restores_it."""
    world = World()
    first_owner(world)
    ids = {}
    for base in (100, 200, 300):
        world.w_set("K", base)
        ids[base] = world.data("K", base + 50)
    ack_all(world, "seeker")
    world.settle()
    assert world.latest("seeker").event_time == 300  # type: ignore[union-attr]
    world.subscriptions["seeker"] = before_entry(ids[200])
    world.settle()
    assert world.latest("seeker").event_time == 200  # type: ignore[union-attr]
    world.subscriptions["seeker"] = before_entry(ids[100])
    world.settle()
    assert world.latest("seeker").event_time == 100  # type: ignore[union-attr]
    ack_all(world, "seeker")
    world.settle()
    assert world.latest("seeker").event_time == 300  # type: ignore[union-attr]


def test_a_seek_to_the_same_watermark_is_published_again() -> None:
    """The chaos suite waits for a value at or before the new position: an unchanged one is published too."""
    world = World()
    first_owner(world)
    world.w_set("K", 100)
    back = world.data("K", 110)
    world.data("K", 120)
    ack_all(world, "sub")
    world.settle()
    published = len(world.tables)
    world.subscriptions["sub"] = back[:2]
    world.settle()
    assert len(world.tables) == published + 1
    assert world.latest("sub").position == back[:2] and world.latest("sub").event_time == 100  # type: ignore[union-attr]


def test_a_producer_going_idle_is_published_even_when_the_watermark_stays() -> None:
    """`broker-ext status` and an attaching consumer read the latest table: it must name the idle producer (a CI
    flake of test_auth: the W_IDLE was acknowledged after the table for the W_SET before it, and never published)."""
    world = World()
    first_owner(world)
    world.w_set("A", 100)
    world.w_set("B", 200)
    ack_all(world, "sub")
    world.settle()
    published = len(world.tables)
    world.w_idle("B")
    ack_all(world, "sub")
    world.settle()
    assert len(world.tables) == published + 1
    event = world.latest("sub")
    assert event is not None and (event.event_time, event.idle, dict(event.active)) == (100, ("B",), {"A": 100})


def test_a_new_producer_above_the_watermark_is_published_but_a_higher_assertion_alone_is_not() -> None:
    """The table follows who holds the watermark (active and idle producers, open transactions), not every
    assertion: one table per W_SET that changes no watermark would double the tables of a burst."""
    world = World()
    first_owner(world)
    world.w_set("A", 100)
    ack_all(world, "sub")
    world.settle()
    world.w_set("B", 300)
    ack_all(world, "sub")
    world.settle()
    event = world.latest("sub")
    assert event is not None and dict(event.active) == {"A": 100, "B": 300}
    published = len(world.tables)
    world.w_set("B", 400)
    ack_all(world, "sub")
    world.settle()
    assert len(world.tables) == published


def test_a_new_subscription_is_followed_and_a_removed_one_forgotten() -> None:
    world = World()
    engine = first_owner(world)
    world.w_set("A", 100)
    ack_all(world, "one")
    world.settle()
    world.subscriptions["two"] = (10, -1)
    world.w_set("A", 200)
    ack_all(world, "two")
    world.settle()
    assert {e.subscription for _, e in world.tables if e.event_time == 200} == {"two"}
    del world.subscriptions["one"]
    world.poll()
    assert of(world, SubscriptionRemoved) == [SubscriptionRemoved("one")]
    assert set(engine.trackers) == {"two"}
    world.w_set("A", 300)
    ack_all(world, "two")
    world.settle()
    assert world.latest_table_holds("one") is None


def test_ownership_lost_drops_the_state_and_publishes_nothing_more() -> None:
    world = World()
    engine = first_owner(world)
    world.w_set("A", 100)
    ack_all(world, "sub")
    world.settle()
    other = world.engine()
    world.own(other)
    assert isinstance(engine.phase, Unowned) and engine.trackers == {} and engine.wakeup_at is None
    published = len(world.tables)
    world.send(engine, world.polled())
    assert len(world.tables) == published


def test_no_table_before_a_new_owners_tracker_reached_the_mark_delete_position() -> None:
    """Mirrors the chaos finding "a new generator owner published a watermark short of the subscription's
    position": the previous owner published 300; the successor has read up to 200 so far."""
    world = World(config=EngineConfig(snapshot_interval_messages=2))
    first_owner(world)
    world.w_set("A", 100)
    world.settle()
    world.w_set("A", 200)
    world.w_set("A", 300)
    ack_all(world, "sub")
    successor = world.engine()
    world.own(successor)
    world.deliver(2)
    world.tick(1)
    world.poll()
    assert successor.trackers["sub"].state.watermark in (100, 200)
    assert world.latest("sub") is None
    world.settle()
    assert world.latest("sub").event_time == 300  # type: ignore[union-attr]


def test_every_table_names_every_subscription_that_has_a_value_even_one_acknowledged_ahead_of_the_head() -> None:
    """Issue #26 (2): a subscription acknowledged ahead of the generator's head was left out of the table the
    next change published, and, ready later with an unchanged value, never published again: after
    compaction a consumer attaching to it got no watermark."""
    world = World()
    first_owner(world)
    world.w_set("A", 100)
    ack_all(world, "ahead")
    ack_all(world, "other")
    world.settle()
    assert world.latest_table_holds("ahead").event_time == 100  # type: ignore[union-attr]
    first = world.data("A", 110)
    world.data("A", 120)
    world.deliver(1)  # the generator has read up to `first` only
    ack_all(world, "ahead")  # acknowledged past what the generator read
    world.subscriptions["new"] = first[:2]  # a change: the next table goes out now
    world.poll()
    assert world.latest_table_holds("new").event_time == 100  # type: ignore[union-attr]
    assert world.latest_table_holds("ahead").event_time == 100  # type: ignore[union-attr]
    assert world.latest_table_holds("other").event_time == 100  # type: ignore[union-attr]
    world.settle()  # "ahead" is ready now, with the same value
    for name in ("ahead", "other", "new"):
        assert world.latest_table_holds(name).event_time == 100, name  # type: ignore[union-attr]


def test_a_subscription_that_never_acknowledges_does_not_pin_the_marker_log() -> None:
    """Issue #26 (3a): an abandoned subscription held every marker after its position in memory (604 -> 2541
    markers over 3600 written). Far behind, it costs a rebuild from the snapshots once it moves, not memory."""
    world = World(config=EngineConfig(snapshot_interval_messages=4, marker_log_limit=10))
    engine = first_owner(world)
    world.w_set("A", 1)
    ack_all(world, "abandoned")
    ack_all(world, "live")
    world.settle()
    sizes = []
    positions = {}
    for t in range(2, 80):
        positions[t] = world.w_set("A", t)
        if t % 10 == 0:
            world.roll()
        ack_all(world, "live")
        world.settle()
        sizes.append(len(following(engine).log))
    assert max(sizes) <= 10 + 4 + 1, sizes  # the limit, plus what comes in between two snapshots
    assert world.latest_table_holds("live").event_time == 79  # type: ignore[union-attr]
    assert world.latest_table_holds("abandoned").event_time == 1  # type: ignore[union-attr]
    world.commands.clear()
    ack(world, "abandoned", positions[40])  # it comes back, to a position the log no longer holds: rebuilt, exact
    world.settle()
    assert world.latest_table_holds("abandoned").event_time == 40  # type: ignore[union-attr]
    assert of(world, ReadMarkerAt) or of(world, ReadRange)


def test_the_marker_log_says_where_to_trim_to_keep_a_number_of_markers_and_keeps_no_snapshot_payload() -> None:
    log = MarkerLog(WatermarkState.initial(), (10, -1, -1))
    for entry in range(5):
        log.append(decode_marker({MARKER_PROPERTY: "W_SET"}, encode_set(entry), "A", (10, entry, -1), entry))  # type: ignore[arg-type]
    assert log.keeping(10) == (10, -1, -1)  # nothing to drop
    assert log.keeping(2) == (10, 2, -1)  # trimming there leaves the markers at entries 3 and 4
    log.trim(log.keeping(2))
    assert len(log) == 2 and log.state_at((10, 4, -1)).watermark == 4
    snapshot = Marker(MarkerKind.W_SNAPSHOT, "__wm_generator-x", (10, 5, -1), 5, body={"signed": b"x" * 1_000})
    log.append(snapshot)
    assert log.fold(log.base, log.base_position, (10, 5, -1)).position == (10, 5, -1)
    assert all(m.body is None for m in log._markers)


# -- the counterexamples of issue #17 --------------------------------------------------------------------


def test_a_seek_to_before_the_first_w_set_publishes_no_watermark_for_the_subscription() -> None:
    """Issue #17 (1): the old worker never published a None watermark, so consumers kept 5000 after a seek
    to before every W_SET: premature for every message redelivered."""
    world = World()
    first_owner(world)
    world.data("A", 900)
    world.w_set("A", 1_000)
    world.w_set("A", 5_000)
    ack_all(world, "sub")
    world.settle()
    assert world.latest("sub").event_time == 5_000  # type: ignore[union-attr]
    world.subscriptions["sub"] = (10, -1)
    world.settle()
    latest = world.latest_table_holds("sub")
    assert latest is not None and latest.event_time is None and latest.position == (10, -1)


def test_a_subscription_recreated_under_the_same_name_gets_no_watermark_where_it_has_none() -> None:
    world = World()
    first_owner(world)
    world.w_set("A", 1_000)
    world.w_set("A", 5_000)
    ack_all(world, "sub")
    world.settle()
    del world.subscriptions["sub"]
    world.poll()
    world.subscriptions["sub"] = (10, -1)  # re-created at the earliest position
    world.settle()
    latest = world.latest_table_holds("sub")
    assert latest is not None and latest.event_time is None


def test_no_watermark_is_published_where_the_partition_never_had_one() -> None:
    """A topic without watermark producers gets no companion topic traffic."""
    world = World()
    first_owner(world)
    world.data("X", 1)
    ack_all(world, "sub")
    world.settle()
    assert world.tables == []


def test_a_redelivery_during_a_take_over_is_ignored_not_buffered_twice() -> None:
    """Issue #17 (2): the old worker buffered the duplicate; replaying it raised in MarkerLog.append and every
    buffered entry after it was lost: A stayed idle, and the watermark 5000 was premature for A's data at 200+."""
    world = World()
    world.w_set("A", 100)
    idle = world.w_idle("A")
    world.hold = {PollCursors}
    engine = world.engine()
    world.own(engine)
    world.deliver()
    world.redeliver(1)  # the consumer reconnects: A's W_IDLE comes again
    world.w_set("A", 200)
    world.w_set("B", 5_000)
    world.deliver()
    world.hold = set()
    world.release(engine)
    world.settle()
    assert following(engine).head.watermark == 200
    assert following(engine).head.producers["A"].idle is False
    with pytest.raises(ValueError):  # what the old replay ran into
        log = MarkerLog(WatermarkState.initial(), (10, -1, -1))
        marker = decode_marker({MARKER_PROPERTY: "W_IDLE"}, b"\x81\xa1v\x01", "A", idle, 1)
        assert marker is not None
        log.append(marker)
        log.append(marker)


# -- what the engine reports ------------------------------------------------------------------------------


def test_the_head_watermark_is_told_whenever_it_changes() -> None:
    world = World()
    first_owner(world)
    a = world.w_set("A", 100)
    world.w_set("A", 100)
    b = world.w_set("A", 150)
    world.settle()
    assert [(h.position, h.watermark) for h in world.head_watermarks] == [(a, 100), (b, 150)]


def test_the_read_lag_is_told_when_it_changes_and_while_the_head_is_behind_not_at_every_poll_at_the_tail() -> None:
    """Issue 47: a poll at the tail once more changes nothing the shell shows (the gauge holds 0, no stall to time);
    a lag is told at every poll, so the shell's watch of a stalled intake sees time pass."""
    world = World()
    world.w_set("A", 50)
    first_owner(world)
    world.commands.clear()
    world.poll()
    world.poll()
    assert of(world, ReadLag) == []  # at the tail since the take-over's poll
    world.w_set("A", 100)
    world.poll()
    world.poll()
    assert of(world, ReadLag) == [ReadLag(1), ReadLag(1)]
    world.deliver()
    world.poll()
    world.poll()
    assert of(world, ReadLag) == [ReadLag(1), ReadLag(1), ReadLag(0)]


def test_broken_assertions_and_unusable_snapshots_are_reported_and_skipped() -> None:
    world = World()
    first_owner(world)
    world.w_set("A", 100)
    late = world.data("A", 50)
    world.data("A", 150)
    position = world._append(marker=(MarkerKind.W_SNAPSHOT, "__wm_generator-x", encode_set(1)))
    world.settle()
    assert of(world, BrokenAssertion) == [BrokenAssertion("A", 50, late)]
    assert of(world, UnusableSnapshot) == [UnusableSnapshot(position, "bad-signature")]  # not signed by a generator
    assert MarkerFolded(position) in world.commands


def test_data_summed_by_the_plugin_is_judged_by_its_lowest_and_counts_toward_the_next_snapshot() -> None:
    """The broker plugin's intake hands data as stretches (per producer: messages, lowest event time) instead of
    one entry per message: a producer is judged by its lowest, and every message counts toward a snapshot."""
    world = World(config=EngineConfig(snapshot_interval_messages=10))
    engine = first_owner(world)
    marker_at = world.w_set("A", 100)
    world.deliver()
    world.commands.clear()
    end = (marker_at[0], marker_at[1] + 3, 7)  # the last data message: index 7 of a batch three entries on
    world.send(engine, EntryRead(end, stretch=(("A", 6, 50), ("B", 3, 10), ("C", 2, 0))))
    assert of(world, BrokenAssertion) == [BrokenAssertion("A", 50, end)]  # B never promised; C said no time
    assert engine.head_position == end
    assert [w.state.position for w in of(world, WriteSnapshot) if w.periodic] == [end]  # 1 marker + 9 messages


def test_a_partitions_table_names_its_base_topic_and_index() -> None:
    world = World()
    engine = PartitionEngine(f"{TOPIC}-partition-3", world.config)
    world.own(engine)
    world.w_set("A", 100)
    ack_all(world, "sub")
    world.settle()
    event = world.latest("sub")
    assert event is not None and (event.topic, event.partition) == (TOPIC, 3)
    tables = of(world, PublishTable)
    assert tables[-1].changed == ("sub",)


def test_results_of_an_abandoned_rebuild_are_ignored() -> None:
    world = World(list_ledgers=False)  # else a fresh topic's take-over needs no read
    world.w_set("A", 100)
    engine = world.engine()
    world.hold = {ReadRange}
    world.own(engine)
    world.deliver()
    request = world.held[0]
    assert isinstance(request, ReadRange)
    world.own(world.engine())
    commands = engine.handle(RangeRead(request.request, None, (), frozenset()), world.now)
    assert commands == [] and isinstance(engine.phase, Unowned)


# -- incarnations (issue 26 item 1) -------------------------------------------------------------------


def test_a_fresh_partition_sets_its_incarnation_as_the_topic_property_before_publishing_under_it() -> None:
    world = World()
    world.w_set("A", 100)
    ack_all(world, "s")
    engine = first_owner(world)
    token = engine.incarnation
    assert token is not None and world.incarnation == token
    claim = next(i for i, c in enumerate(world.commands) if isinstance(c, ClaimIncarnation))
    published = [i for i, c in enumerate(world.commands) if isinstance(c, PublishTable | HeadWatermark)]
    assert published and min(published) > claim
    assert {e.incarnation for _, e in world.tables} == {token}
    assert {h.incarnation for h in world.head_watermarks} == {token}
    world.w_set("A", 200)
    world.settle()
    snapshots = [c for c in of(world, WriteSnapshot)]
    assert snapshots and {c.incarnation for c in snapshots} == {token}


def test_a_take_over_keeps_the_incarnation_of_the_snapshot_it_restores_from() -> None:
    world = World()
    world.w_set("A", 100)
    first = first_owner(world)
    for _ in range(6):
        world.data("A", 150)
    world.settle()
    token = first.incarnation
    second = world.engine()
    world.own(second)
    world.commands.clear()
    world.settle()
    assert second.incarnation == token == world.incarnation
    assert of(world, ClaimIncarnation) == []


def test_a_recreated_topic_under_a_following_engine_is_followed_anew_with_none_of_the_old_state() -> None:
    """The generator's consumer went on delivering the new topic's entries (Pulsar's client reconnects): the
    engine folded them into the old state and published it under the old token; readers ignore that token, and
    its next periodic snapshot finds the property gone and asks to follow the topic anew."""
    world = World()
    world.w_set("old", 10 * 3_600_000)
    ack_all(world, "s")
    stale = first_owner(world)
    old = stale.incarnation
    world.recreate()
    world.w_set("new", 1_000)
    for _ in range(5):
        world.data("new", 1_000)
    world.settle()
    assert world.restarts and isinstance(stale.phase, Unowned)
    fresh = world.engine()  # discovery follows the topic anew
    world.own(fresh)
    world.commands.clear()
    world.head_watermarks.clear()
    ack_all(world, "s")
    world.settle()
    assert fresh.incarnation not in (None, old) and world.incarnation == fresh.incarnation
    assert [h.watermark for h in world.head_watermarks] == [1_000]  # the old state's 10 h is not restored
    assert {e.event_time for _, e in world.tables if e.incarnation == fresh.incarnation} == {1_000}


def test_a_recreated_topic_without_a_token_is_noticed_by_its_creation_time_and_followed_anew() -> None:
    """Issue 33: with least privileges the generator may not set the property, so no token tells the topics apart;
    the broker plugin's creation time does. Before, the new topic was folded into the old state (10 h)."""
    world = World(may_claim=False, created=1_700_000_000_000)
    world.w_set("old", 10 * 3_600_000)
    ack_all(world, "s")
    stale = first_owner(world)
    assert stale.incarnation is None
    world.recreate()
    world.w_set("new", 1_000)
    ack_all(world, "s")
    world.poll()
    world.settle()
    assert world.restarts and isinstance(stale.phase, Unowned)
    fresh = world.engine()
    world.own(fresh)
    world.commands.clear()
    world.head_watermarks.clear()
    ack_all(world, "s")
    world.settle()
    assert [h.watermark for h in world.head_watermarks] == [1_000]


def test_a_recreated_topic_whose_first_entry_comes_before_the_creation_time_restores_none_of_the_old_state() -> None:
    """Issue 46 (1): the old engine's consumer is handed the new topic's first entry before the plugin's report with
    the new creation time. Entering that higher ledger, it wrote a ledger-start snapshot of the old state (no token:
    least privileges) into the new topic; the engine started anew after the report restored from it (10 h)."""
    world = World(may_claim=False, created=1_700_000_000_000)
    world.w_set("old", 10 * 3_600_000)
    ack_all(world, "s")
    stale = first_owner(world)
    world.recreate()
    world.w_set("new", 1_000)
    for _ in range(5):
        world.data("new", 1_000)
    world.deliver()  # the entries come straight from the broker, before the plugin's report
    world.poll()  # the report with the new creation time
    assert world.restarts and isinstance(stale.phase, Unowned)
    fresh = world.engine()
    world.own(fresh)
    world.commands.clear()
    world.head_watermarks.clear()
    world.tables.clear()
    ack_all(world, "s")
    world.settle()
    assert [h.watermark for h in world.head_watermarks] == [1_000]
    assert {e.event_time for _, e in world.tables} == {1_000}


def test_a_recreation_is_noticed_after_the_topic_fell_back_to_admin_reads() -> None:
    """Issue 46 (2): the creation time counts per answer. The engine saw one from the plugin, then the topic's
    cursors came from the admin API (no creation time: a broker without the plugin, a plugin answering 401); the
    topic was re-created. The periodic property read must come back, or the new topic never gets a watermark."""
    world = World(config=EngineConfig(snapshot_interval_messages=3), created=1_700_000_000_000)
    world.w_set("old", 10 * 3_600_000)
    ack_all(world, "s")
    stale = first_owner(world)
    assert stale.incarnation is not None and stale.created
    world.created = 0  # the admin API's answers say nothing of it
    world.poll()
    world.recreate()
    world.w_set("new", 1_000)
    for _ in range(5):
        world.data("new", 1_000)
    world.settle()
    assert world.restarts and isinstance(stale.phase, Unowned)
    fresh = world.engine()
    world.own(fresh)
    world.head_watermarks.clear()
    ack_all(world, "s")
    world.settle()
    assert [h.watermark for h in world.head_watermarks] == [1_000]
    assert world.latest("s") is not None and world.latest("s").event_time == 1_000  # type: ignore[union-attr]


def test_a_snapshot_stamped_with_another_creation_time_is_not_restored_from() -> None:
    """A snapshot carries the creation time of the incarnation it was computed under: a take-over never restores
    from one of another incarnation, even without a token (least privileges), and folds the log instead."""
    world = World(may_claim=False, created=1_700_000_000_000)
    world.w_set("A", 100)
    other = WatermarkState.initial().advanced_to(world.history[-1].position)  # no producer: no watermark
    world.snapshot_record(other, None, "__wm_generator-world", created=1_699_999_999_000)
    ack_all(world, "s")
    engine = first_owner(world)
    assert engine.head is not None and engine.head.watermark == 100
    assert world.latest("s") is not None and world.latest("s").event_time == 100  # type: ignore[union-attr]


def test_with_the_creation_time_known_a_periodic_snapshot_reads_no_topic_property() -> None:
    """The plugin's creation time tells a re-created topic (above), so the property is not read again at every
    periodic snapshot: that was one admin call per topic every snapshot interval, the broker's CPU in steady state.
    Without a creation time (the admin API path) the property is still read."""
    for created, reads in ((1_700_000_000_000, False), (0, True)):
        world = World(config=EngineConfig(snapshot_interval_messages=3), created=created)
        world.w_set("A", 0)
        ack_all(world, "s")
        engine = first_owner(world)
        assert engine.incarnation is not None, f"created={created}"
        world.commands.clear()
        for i in range(1, 4):
            world.w_set("A", i)
        world.settle()
        assert [w for w in of(world, WriteSnapshot) if w.periodic], f"created={created}"
        assert bool(of(world, ReadIncarnation)) is reads, f"created={created}"


def test_without_the_right_to_set_the_property_events_go_out_without_a_token() -> None:
    world = World(may_claim=False)
    world.w_set("A", 100)
    ack_all(world, "s")
    engine = first_owner(world)
    assert engine.incarnation is None and world.incarnation is None
    assert world.tables and {e.incarnation for _, e in world.tables} == {None}
    assert [h.watermark for h in world.head_watermarks] == [100]


def test_while_the_property_is_being_set_the_engine_asks_for_no_tick_it_cannot_use() -> None:
    """Found on the real broker: a snapshot due but held back by the open claim made `wakeup_at` a time in the
    past, and the shell's loop spun on Ticks, starving the claim's own answer."""
    world = World()
    world.w_set("A", 100)
    world.hold = {ClaimIncarnation}
    engine = world.engine()
    world.own(engine)
    world.settle()
    assert of(world, ClaimIncarnation) and following(engine).snapshots_due
    assert engine.wakeup_at is None or engine.wakeup_at > world.now
    assert world.tables == [] and world.head_watermarks == []  # nothing goes out before the property is set
    world.hold = set()
    world.release(engine)
    world.settle()
    assert [h.watermark for h in world.head_watermarks] == [100] and engine.incarnation == world.incarnation
