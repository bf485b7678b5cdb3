"""The generator's side of the broker plugin: what each answer does to the partitions (no broker, no threads)."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker_ext.engine.vocabulary import CursorsPolled
from broker_ext.intake.admin_polling import CursorPoller
from broker_ext.intake.plugin_cursors import ACK_GATHER_S, WRITE_GATHER_S, PluginCursors, cursors_from
from broker_ext.loop import EventLoop
from pulsar_access.admin import PluginMissing

pytestmark = pytest.mark.unit

T0 = "persistent://public/default/t"
B1, B2 = "http://127.0.0.1:8080", "http://127.0.0.1:8081"


def _report(acknowledged: int, owner: str | None = "c") -> dict[str, Any]:
    return {
        "owner": owner,
        "created": 1_700_000_000_000,
        "lastConfirmed": [5, 30],
        "ledgers": [[4, 10], [5, 0]],
        "cursors": {"__wm_generator": [5, 2], "__compaction": [5, 1], "app": [5, acknowledged]},
    }


class _Partition(SimpleNamespace):
    def cursors(self, polled: CursorsPolled) -> None:
        self.told.append(polled)

    def lost(self, owner: str) -> None:
        self.lost_to.append(owner)

    def named_owner(self, polled: CursorsPolled) -> None:
        self.named.append(polled)

    def ours(self, owner: str | None) -> bool:  # as `PartitionIO.ours`, by Failover, or by claim where set
        if getattr(self, "claimed", None) is not None:
            return bool(self.claimed)
        return owner == self.consumer_name or (owner is None and bool(self.owner))


def _recording(handed: list[Any], *, with_cursors: bool = False) -> Callable[..., bool]:
    """A partition's `intake`: records each report; with `with_cursors`, takes the answer's cursors with it (as
    `PartitionIO.intake` does while it follows the partition through the plugin) and records them too."""

    def intake(report: Any, cursors: CursorsPolled | None = None) -> bool:
        handed.append(report)
        if with_cursors and cursors is not None:
            handed.append(cursors)
            return True
        return False

    return intake


def _partition(topic: str = T0) -> Any:
    return _Partition(topic=topic, base_topic=topic, partition=-1, consumer_name="c", closed=False,
                      owner=True, wants_cursors=True, told=[], lost_to=[], named=[])  # fmt: skip


def _cursors() -> PluginCursors:
    loop = EventLoop("test-loop")  # never started: what is posted is run by _run_posted
    poller = CursorPoller(loop, cast(Any, None), cast(Any, None), poll_interval_s=0.05, idle_poll_interval_s=1.0,
                          stats_rate=10.0)  # fmt: skip
    lookups: list[Any] = []  # lookups of who serves a topic, submitted to the admin pool (not run here)
    return PluginCursors(loop, cast(Any, SimpleNamespace(admin_bases=[B1])), poller,
                         cast(Any, SimpleNamespace(submit=lookups.append)))  # fmt: skip


def _run_posted(cursors: PluginCursors) -> None:
    pending = cursors.loop._queue
    while True:
        try:
            work = pending.get_nowait()
        except queue.Empty:
            return
        if getattr(work, "__name__", "") != "_flush":  # the admin poller's reads would need an admin API
            work()


def test_a_report_reads_as_an_internal_stats_read_would() -> None:
    polled, owner = cursors_from(_report(7))
    assert polled == CursorsPolled(
        subscriptions={"app": (5, 7)},
        generator_cursor=(5, 2),
        last_confirmed=(5, 30),
        ledgers=((4, 10), (5, 0)),
        created=1_700_000_000_000,
    )
    assert owner == "c"


def test_a_move_goes_to_the_owner_and_the_sweep_leaves_the_partition_alone() -> None:
    cursors, partition = _cursors(), _partition()
    cursors.add(partition)
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": {T0: _report(3)}, "gone": []})
    assert [p.subscriptions["app"] for p in partition.told] == [(5, 3)]
    assert cursors.poller.states[T0].pushed
    cursors.after(partition, marker_read=True)  # no fast poll: moves are pushed
    assert cursors.loop.scheduled((T0, "poll")) is None
    cursors.request(partition)  # answered from what the plugin said, without an admin call
    _run_posted(cursors)
    assert [p.subscriptions["app"] for p in partition.told] == [(5, 3), (5, 3)]
    assert not cursors.poller._wanted


def test_the_incarnation_a_plugin_reports_answers_a_take_over_without_an_admin_read() -> None:
    """The topic property `wm.incarnation` rides in the plugin's report: a take-over (a standby's after a kill too)
    needs no admin call to read it. Unset, or not reported (an older plugin, a topic no plugin serves): the admin
    API reads it, as it always did."""
    cursors, partition = _cursors(), _partition()
    cursors.add(partition)
    assert cursors.incarnation(partition) is None  # no plugin reports it yet
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": {T0: _report(3)}, "gone": []})
    assert cursors.incarnation(partition) is None  # an older plugin: no such field
    set_here = {**_report(3), "incarnation": "0123456789abcdef"}
    cursors._answered(B1, {"epoch": "e", "seq": 2, "full": False, "topics": {T0: set_here}, "gone": []})
    assert cursors.incarnation(partition) == "0123456789abcdef"
    cursors._answered(B1, {"epoch": "e", "seq": 3, "full": False, "topics": {}, "gone": [T0]})
    assert cursors.incarnation(partition) is None  # gone from its broker: not known here any more
    assert cursors.poller.incarnation(partition) is None  # the admin path knows none without a call


def test_another_owner_reported_is_a_lost_partition() -> None:
    cursors, partition = _cursors(), _partition()
    cursors.add(partition)
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": {T0: _report(3, owner="d")}, "gone": []})
    assert partition.lost_to == ["d"] and partition.told == []


def test_a_partition_not_delivered_to_yet_hears_that_the_broker_chose_our_consumer() -> None:
    """Pulsar delivers to a Failover subscription's chosen consumer a second later (its failover delay): the
    partition may read ahead meanwhile (broker_ext/partition_io.py `named_owner`)."""
    cursors, ours, theirs = _cursors(), _partition(T0), _partition(T0 + "-other")
    for partition in (ours, theirs):
        partition.owner = partition.wants_cursors = False
        cursors.add(partition)
    topics = {T0: _report(3, owner="c"), T0 + "-other": _report(3, owner="d")}
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": topics, "gone": []})
    assert [p.generator_cursor for p in ours.named] == [(5, 2)] and ours.told == []
    assert theirs.named == [] and theirs.told == [] and theirs.lost_to == []


def test_a_topic_gone_from_its_broker_goes_back_to_admin_reads_until_another_broker_reports_it() -> None:
    cursors, partition = _cursors(), _partition()
    cursors.add(partition)
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": {T0: _report(3)}, "gone": []})
    cursors._answered(B1, {"epoch": "e", "seq": 2, "full": False, "topics": {}, "gone": [T0]})
    assert not cursors.poller.states[T0].pushed
    assert T0 in cursors.poller._wanted  # read through the admin API meanwhile
    cursors.after(partition, marker_read=True)
    assert cursors.loop.scheduled((T0, "poll")) is not None  # fast polls again while a marker waits
    cursors._answered(B2, {"epoch": "f", "seq": 9, "full": True, "topics": {T0: _report(4)}, "gone": []})
    assert cursors.poller.states[T0].pushed and partition.told[-1].subscriptions["app"] == (5, 4)


def test_a_late_gone_from_the_old_broker_does_not_drop_what_the_new_one_reports() -> None:
    cursors, partition = _cursors(), _partition()
    cursors.add(partition)
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": {T0: _report(3)}, "gone": []})
    cursors._answered(B2, {"epoch": "f", "seq": 1, "full": True, "topics": {T0: _report(4)}, "gone": []})
    cursors._answered(B1, {"epoch": "e", "seq": 2, "full": False, "topics": {}, "gone": [T0]})
    assert cursors.poller.states[T0].pushed and cursors._pushed[T0].broker == B2


def test_a_full_answer_drops_what_the_broker_no_longer_serves() -> None:
    cursors, partition = _cursors(), _partition()
    cursors.add(partition)
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": {T0: _report(3)}, "gone": []})
    cursors._answered(B1, {"epoch": "restarted", "seq": 0, "full": True, "topics": {}, "gone": []})
    assert not cursors.poller.states[T0].pushed and T0 not in cursors._pushed


def test_a_broker_without_the_plugin_leaves_its_topics_to_admin_reads() -> None:
    cursors, partition = _cursors(), _partition()
    cursors.add(partition)
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": {T0: _report(3)}, "gone": []})
    cursors._plugin_missing(B1, "404")
    assert not cursors.poller.states[T0].pushed and B1 in cursors._absent
    cursors._follow_broker(B1)  # not asked again soon
    assert B1 not in cursors._brokers


def test_topics_announced_that_no_partition_follows_yet_are_handed_to_discovery() -> None:
    cursors, partition = _cursors(), _partition()
    told: list[list[str]] = []
    cursors.fresh = told.append
    cursors.add(partition)
    other = "persistent://public/default/fresh"
    cursors._answered(B1, {"epoch": "e", "seq": 3, "full": False, "topics": {}, "gone": [], "new": [T0, other]})
    assert told == [[other]]  # T0 is followed already


def _acknowledged(partition: Any) -> list[int]:
    return [p.subscriptions["app"][1] for p in partition.told]


def test_a_request_delivers_what_is_latest_when_it_is_delivered_not_when_it_was_asked() -> None:
    """Issue 46 (3): a newer answer already queued was handed over first, then the copy the request had read; the
    engine took the older position as a move back, and the plugin pushes only real moves, so nothing corrected it."""
    cursors, partition = _cursors(), _partition()
    cursors.add(partition)
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": {T0: _report(1)}, "gone": []})
    newer = {"epoch": "e", "seq": 2, "full": False, "topics": {T0: _report(3)}, "gone": []}
    cursors.loop.post(lambda: cursors._answered(B1, newer))  # the poll's thread queued it before the request
    cursors.request(partition)
    _run_posted(cursors)
    assert _acknowledged(partition)[-1] == 3 and sorted(_acknowledged(partition)) == _acknowledged(partition)


def test_an_admin_read_answered_after_the_plugin_took_the_topic_over_is_not_handed_over() -> None:
    """Issue 46 (3), the admin path: a fast poll in flight when the topic switched to plugin pushes answers with
    what it read before the push; handing it over would move the subscription back."""
    cursors, partition = _cursors(), _partition()
    cursors.add(partition)
    cursors.poller.states[T0].durable = frozenset({"app"})
    cursors.poller.request(partition)
    cursors.poller._flush_posted = False
    wanted = cursors.poller._wanted.pop(T0)
    cursors.poller.states[wanted.topic].in_flight = True  # read through the admin API ...
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": {T0: _report(3)}, "gone": []})
    internal = {
        "lastConfirmedEntry": "5:30",
        "ledgers": [{"ledgerId": 5, "entries": 31}],
        "cursors": {"app": {"markDeletePosition": "5:1"}, "__wm_generator": {"markDeletePosition": "5:2"}},
    }
    cursors.poller._answered([partition], {T0: (internal, None)})  # ... answered after the push
    assert _acknowledged(partition) == [3] and not cursors.poller.states[T0].in_flight
    cursors.poller.request(partition)  # a fast poll armed before the push fires: no admin call for it
    assert T0 not in cursors.poller._wanted


def test_a_poll_of_a_broker_that_went_away_ends_and_lookups_of_removed_topics_are_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 46 (6): a broker found by a lookup that stops answering (it was removed from the cluster) had a poll
    thread for good; the lookup times of every topic ever followed were kept for good."""
    import broker_ext.intake.plugin_cursors as module

    monkeypatch.setattr(module, "RETRY_MAX_S", 0.01)
    monkeypatch.setattr(module, "GIVE_UP_AFTER_S", 0.05)
    gone = "http://127.0.0.1:9"

    def unreachable(broker: str, *args: object, **kwargs: object) -> dict[str, Any]:
        raise module.AdminError(f"connection refused: {broker}")

    cursors, partition = _cursors(), _partition()
    cursors.admin = cast(Any, SimpleNamespace(admin_bases=[B1], plugin_changes=unreachable))
    cursors._follow_broker(gone)
    cursors._brokers[gone].join(timeout=5)
    assert not cursors._brokers[gone].is_alive()
    _run_posted(cursors)
    assert gone not in cursors._brokers  # a later lookup that names it polls it again
    cursors.add(partition)
    cursors.owned(partition)
    assert T0 in cursors._looked_up
    cursors.remove(partition)
    assert T0 not in cursors._looked_up


def test_with_the_intake_what_a_plugin_found_goes_to_the_partition_it_chose_and_back_to_its_consumer_after() -> None:
    cursors, ours, theirs = _cursors(), _partition(T0), _partition(T0 + "-other")
    cursors.intake = True
    handed: dict[str, list[Any]] = {T0: [], T0 + "-other": []}
    for partition in (ours, theirs):
        partition.intake = _recording(handed[partition.topic])
        cursors.add(partition)
    found = {"found": [{"data": [5, 3, -1], "producers": {"a": [2, 7]}}], "scannedTo": [5, 3], "overflowed": False}
    topics = {T0: {**_report(3, owner="c"), "intake": found}, T0 + "-other": {**_report(3, owner="d"), "intake": found}}
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": topics, "gone": []})
    (report,) = handed[T0]
    assert [e.stretch for e in report.entries] == [(("a", 2, 7),)] and report.scanned_to == (5, 3)
    assert handed[T0 + "-other"] == []  # another generator's consumer holds it
    cursors._answered(B1, {"epoch": "e", "seq": 2, "full": False, "topics": {}, "gone": [T0]})
    assert handed[T0][-1] is None  # no plugin reports it now: its consumer receives again


def test_what_a_plugin_found_goes_to_the_partition_with_the_answers_cursors_as_one_handing() -> None:
    """Issue 47: a partition that takes the findings with the cursors of the same answer (one engine event) is not
    told those cursors a second time; one that does not take them is told them after the findings."""
    cursors, taking, not_taking = _cursors(), _partition(T0), _partition(T0 + "-other")
    cursors.intake = True
    handed: dict[str, list[Any]] = {T0: [], T0 + "-other": []}
    taking.intake = _recording(handed[T0], with_cursors=True)
    not_taking.intake = _recording(handed[T0 + "-other"])
    for partition in (taking, not_taking):
        cursors.add(partition)
    found = {"found": [{"data": [5, 3, -1], "producers": {"a": [2, 7]}}], "scannedTo": [5, 3], "overflowed": False}
    topics = {t: {**_report(3, owner="c"), "intake": found} for t in handed}
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": topics, "gone": []})
    report, polled = handed[T0]
    assert report.scanned_to == (5, 3) and polled.subscriptions == {"app": (5, 3)}
    assert taking.told == []  # not told again
    (other_report,) = handed[T0 + "-other"]
    assert other_report.scanned_to == (5, 3) and [p.subscriptions for p in not_taking.told] == [{"app": (5, 3)}]


def _refetching(cursors: PluginCursors) -> list[Any]:
    """The one-time asks for everything a plugin keeps, answered by `answer(topics)`."""
    asked: list[Any] = []
    cursors.pool = cast(Any, SimpleNamespace(submit=asked.append))
    return asked


def _answering(cursors: PluginCursors, topics: dict[str, Any]) -> None:
    """The plugin's answer to an ask for everything it keeps."""
    answer = {"epoch": "x", "seq": 9, "full": True, "topics": topics}
    cursors.admin = cast(Any, SimpleNamespace(plugin_changes=lambda *a, **k: answer))


def _answer_refetch(cursors: PluginCursors, asked: list[Any], topics: dict[str, Any]) -> None:
    _answering(cursors, topics)
    for work in asked:
        work()
    asked.clear()
    _run_posted(cursors)


def test_a_partition_that_missed_what_the_plugin_told_while_it_was_not_ours_asks_for_all_it_keeps() -> None:
    cursors, partition = _cursors(), _partition()
    cursors.intake = True
    asked = _refetching(cursors)
    handed: list[Any] = []
    partition.intake = _recording(handed)
    partition.owner = False
    cursors.add(partition)
    found = {"found": [{"data": [5, 3, -1], "producers": {"a": [2, 7]}}], "scannedTo": [5, 3], "overflowed": False}
    topics = {T0: {**_report(3, owner="d"), "intake": found}}
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": False, "topics": topics, "gone": []})
    assert handed == [] and asked == []  # another generator's
    later = {"found": [], "scannedTo": [5, 4], "overflowed": False}  # told since: without what was missed
    topics = {T0: {**_report(3, owner="c"), "intake": later}}
    cursors._answered(B1, {"epoch": "e", "seq": 2, "full": False, "topics": topics, "gone": []})
    # ours now: not handed yet (the engine would take the entries passed over for read); all kept is asked for
    assert handed == [] and len(asked) == 1
    newer = {"found": [{"data": [5, 6, -1], "producers": {"a": [1, 9]}}], "scannedTo": [5, 6], "overflowed": False}
    topics = {T0: {**_report(3, owner="c"), "intake": newer}}  # told by the poll before that answer came
    cursors._answered(B1, {"epoch": "e", "seq": 3, "full": False, "topics": topics, "gone": []})
    assert handed == [] and len(asked) == 1
    everything = {"found": found["found"], "scannedTo": [5, 4], "overflowed": False}
    _answer_refetch(cursors, asked, {T0: {**_report(3, owner="c"), "intake": everything}})
    # all kept first, then what the polls told meanwhile (the engine skips what it has)
    assert [r.scanned_to for r in handed] == [(5, 4), (5, 4), (5, 6)]
    assert handed[0].entries[0].stretch == (("a", 2, 7),) and handed[-1].entries[0].stretch == (("a", 1, 9),)
    cursors._answered(B1, {"epoch": "e", "seq": 4, "full": False, "topics": topics, "gone": []})
    assert len(handed) == 4 and asked == []  # from now on handed as told


def test_by_claim_a_partition_is_ours_once_claimed_and_gets_all_the_plugin_keeps() -> None:
    """Issue 47 (ownership by claim): the broker names no owner (no consumer); what the plugin tells goes to the
    partition once this instance holds the topic's claim, starting with everything the plugin keeps."""
    cursors, partition = _cursors(), _partition()
    cursors.intake = True
    asked = _refetching(cursors)
    handed: list[Any] = []
    partition.intake = _recording(handed)
    partition.owner, partition.claimed = False, False
    cursors.add(partition)
    assert not cursors.claimed(partition)  # no plugin reports it yet: our consumer must receive
    found = {"found": [{"data": [5, 3, -1], "producers": {"a": [2, 7]}}], "scannedTo": [5, 3], "overflowed": False}
    topics = {T0: {**_report(3, owner=None), "intake": found}}
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": topics, "gone": []})
    assert handed == [] and cursors.reports(partition) and cursors.served_by(partition) == B1
    partition.claimed = True
    assert cursors.claimed(partition) and len(asked) == 1
    _answer_refetch(cursors, asked, {T0: {**_report(3, owner=None), "intake": found}})
    assert [r.scanned_to for r in handed] == [(5, 3)]


def test_the_generators_cursor_moves_through_the_plugin_that_reports_the_topic_one_request_per_broker() -> None:
    """Issue 47: where a plugin reports the topic, the generator's cursor moves inside that broker (no consumer
    acknowledgement); the acknowledgements of a second go in one request, the latest per topic."""
    cursors, partition, other = _cursors(), _partition(), _partition(T0 + "-2")
    sent: list[tuple[str, dict[str, tuple[int, int]]]] = []
    cursors.admin = cast(Any, SimpleNamespace(plugin_acknowledge=lambda b, p: sent.append((b, dict(p))) or {}))
    submitted: list[Any] = []
    cursors.pool = cast(Any, SimpleNamespace(submit=submitted.append))
    for p in (partition, other):
        cursors.add(p)
    assert not cursors.acknowledge(partition, (5, 2))  # no plugin reports it yet: its consumer acknowledges
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": {T0: _report(3)}, "gone": []})
    assert cursors.acknowledge(partition, (5, 2)) and cursors.acknowledge(partition, (5, 3))
    assert not cursors.acknowledge(other, (5, 1))
    _run_posted(cursors)
    assert submitted == [] and sent == []  # gathered for a while first
    due = cursors.loop.scheduled(("plugin-acks", B1))
    assert due is not None and due - time.time() > ACK_GATHER_S / 2
    cursors._send_acks(B1)
    for work in submitted:
        work()
    assert sent == [(B1, {T0: (5, 3)})]


def test_a_partition_that_becomes_ours_while_all_kept_is_being_asked_for_waits_for_an_answer_asked_after() -> None:
    """The answer in flight was made before the partition became ours: what was told between it and the claim
    went to nobody, so that partition is handed the next answer, asked for when the first one comes."""
    cursors, first, second = _cursors(), _partition(T0), _partition(T0 + "-2")
    cursors.intake = True
    asked = _refetching(cursors)
    handed: dict[str, list[Any]] = {T0: [], T0 + "-2": []}
    for partition in (first, second):
        partition.intake = _recording(handed[partition.topic])
        partition.owner, partition.claimed = False, False
        cursors.add(partition)
    found = {"found": [{"data": [5, 3, -1], "producers": {"a": [2, 7]}}], "scannedTo": [5, 3], "overflowed": False}
    topics = {t: {**_report(3, owner=None), "intake": found} for t in handed}
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True, "topics": topics, "gone": []})
    first.claimed = True
    assert cursors.claimed(first) and len(asked) == 1
    in_flight = asked.pop()
    second.claimed = True
    assert cursors.claimed(second) and asked == []  # one request per broker at a time
    _answering(cursors, topics)
    in_flight()
    _run_posted(cursors)
    assert len(handed[T0]) == 1 and handed[T0 + "-2"] == [] and len(asked) == 1  # asked again, for the second
    _answer_refetch(cursors, asked, topics)
    assert len(handed[T0]) == 1 and len(handed[T0 + "-2"]) == 1


def test_subscriptions_to_make_go_to_every_polled_plugin_in_one_request_and_the_admin_api_makes_the_rest() -> None:
    """Issue 47's take-over: making `__wm_generator` and setting the incarnation property took two admin calls per
    partition (8 s of 1000 partitions' take-over). The partitions of a turn go to each polled broker's plugin in one
    request; one that no plugin serves is told None (the admin API makes it), the others the token in place."""
    from pulsar_access.admin import PluginFollowed

    cursors, partition, other, away = _cursors(), _partition(), _partition(T0 + "-2"), _partition(T0 + "-3")
    for p in (partition, other, away):
        p.followed_with = []
        p.followed = p.followed_with.append
    sent: list[tuple[str, dict[str, str]]] = []

    def plugin_follow(broker: str, tokens: dict[str, str]) -> PluginFollowed:
        sent.append((broker, dict(tokens)))
        if broker == B1:
            return PluginFollowed({T0: "00000000000000aa"}, [T0 + "-2", T0 + "-3"], {})
        return PluginFollowed({T0 + "-2": tokens[T0 + "-2"]}, [T0 + "-3"], {})

    cursors.admin = cast(Any, SimpleNamespace(admin_bases=[B1], plugin_follow=plugin_follow))
    submitted: list[Any] = []
    cursors.pool = cast(Any, SimpleNamespace(submit=submitted.append))
    assert not cursors.follow(partition, "0123456789abcdef")  # no plugin polled: the admin API makes it
    cursors._brokers = {B1: cast(Any, None), B2: cast(Any, None)}
    for p, token in ((partition, "0123456789abcdef"), (other, "1111111111111111"), (away, "2222222222222222")):
        assert cursors.follow(p, token)
    _run_posted(cursors)
    for work in submitted:
        work()
    _run_posted(cursors)
    assert sent == [
        (B1, {T0: "0123456789abcdef", T0 + "-2": "1111111111111111", T0 + "-3": "2222222222222222"}),
        (B2, {T0 + "-2": "1111111111111111", T0 + "-3": "2222222222222222"}),
    ]
    assert partition.followed_with == ["00000000000000aa"]  # set before: the token in place, not ours
    assert other.followed_with == ["1111111111111111"] and away.followed_with == [None]


def test_a_large_take_over_is_followed_in_requests_of_a_bounded_size_each_answered_on_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """5000 topics in one request would outlast the request's timeout on a busy broker: they go in chunks, and a
    chunk's partitions are told when its answer comes, not after the last chunk's."""
    from broker_ext.intake import plugin_cursors
    from pulsar_access.admin import PluginFollowed

    monkeypatch.setattr(plugin_cursors, "FOLLOW_BATCH", 2)
    cursors = _cursors()
    partitions = [_partition(f"{T0}-{i}") for i in range(3)]
    for p in partitions:
        p.followed_with = []
        p.followed = p.followed_with.append
    sent: list[list[str]] = []

    def plugin_follow(broker: str, tokens: dict[str, str]) -> PluginFollowed:
        sent.append(sorted(tokens))
        return PluginFollowed(dict(tokens), [], {})

    cursors.admin = cast(Any, SimpleNamespace(admin_bases=[B1], plugin_follow=plugin_follow))
    submitted: list[Any] = []
    cursors.pool = cast(Any, SimpleNamespace(submit=submitted.append))
    cursors._brokers = {B1: cast(Any, None)}
    for i, p in enumerate(partitions):
        assert cursors.follow(p, f"{i:016x}")
    _run_posted(cursors)
    assert len(submitted) == 2
    submitted[0]()
    _run_posted(cursors)
    assert [p.followed_with for p in partitions] == [[f"{0:016x}"], [f"{1:016x}"], []]
    submitted[1]()
    _run_posted(cursors)
    assert partitions[2].followed_with == [f"{2:016x}"] and sent == [[f"{T0}-0", f"{T0}-1"], [f"{T0}-2"]]


def test_a_follow_request_that_fails_unexpectedly_still_answers_its_partitions() -> None:
    """A partition whose answer never came would wait for its subscription forever (it asks only once)."""
    cursors, partition = _cursors(), _partition()
    partition.followed_with = []
    partition.followed = partition.followed_with.append

    def plugin_follow(broker: str, tokens: dict[str, str]) -> Any:
        raise ValueError("not what the plugin says")

    cursors.admin = cast(Any, SimpleNamespace(admin_bases=[B1], plugin_follow=plugin_follow))
    submitted: list[Any] = []
    cursors.pool = cast(Any, SimpleNamespace(submit=submitted.append))
    cursors._brokers = {B1: cast(Any, None)}
    assert cursors.follow(partition, "0123456789abcdef")
    _run_posted(cursors)
    with pytest.raises(ValueError):
        submitted[0]()
    _run_posted(cursors)
    assert partition.followed_with == [None]  # the admin API makes it


def test_snapshots_are_written_by_the_plugin_that_reports_the_topic_and_an_older_plugin_leaves_them_to_producers() -> (
    None
):
    """Issue 47: a snapshot record goes to the plugin of the broker that reports its topic, the records of half a
    second in one request; each is answered with where it was written or why not; a plugin without the endpoint
    is not asked again (the partitions' producers write there)."""
    cursors, partition, other = _cursors(), _partition(), _partition(T0 + "-2")
    asked: list[tuple[str, dict[str, tuple[str, bytes]]]] = []
    answers: list[Any] = [{T0: "written 5 7", T0 + "-2": "elsewhere"}, PluginMissing("404", 404)]

    def plugin_write_snapshots(broker: str, records: dict[str, tuple[str, bytes]]) -> Any:
        asked.append((broker, dict(records)))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    cursors.admin = cast(Any, SimpleNamespace(plugin_write_snapshots=plugin_write_snapshots))
    submitted: list[Any] = []
    cursors.pool = cast(Any, SimpleNamespace(submit=submitted.append))
    done: list[tuple[str, Any, Any]] = []
    for p in (partition, other):
        cursors.add(p)
    assert not cursors.write_snapshot(partition, "g", b"s0", lambda w, f: done.append(("t", w, f)))  # not reported
    cursors._answered(B1, {"epoch": "e", "seq": 1, "full": True,
                           "topics": {T0: _report(3), T0 + "-2": _report(3)}, "gone": []})  # fmt: skip
    assert cursors.write_snapshot(partition, "g", b"s1", lambda w, f: done.append(("t", w, f)))
    assert cursors.write_snapshot(other, "g", b"s2", lambda w, f: done.append(("t2", w, f)))
    _run_posted(cursors)
    assert submitted == [] and asked == []  # gathered for a while first
    due = cursors.loop.scheduled(("plugin-writes", B1))
    assert due is not None and due - time.time() > WRITE_GATHER_S / 2
    cursors._send_writes(B1)
    for work in submitted:
        work()
    _run_posted(cursors)
    assert asked == [(B1, {T0: ("g", b"s1"), T0 + "-2": ("g", b"s2")})]
    assert done == [("t", (5, 7, -1), None), ("t2", None, "elsewhere")]

    submitted.clear()
    done.clear()
    assert cursors.write_snapshot(partition, "g", b"s3", lambda w, f: done.append(("t", w, f)))
    cursors._send_writes(B1)
    for work in submitted:
        work()
    _run_posted(cursors)
    assert done[0][1] is None and "404" in done[0][2]
    assert not cursors.write_snapshot(partition, "g", b"s4", lambda w, f: done.append(("t", w, f)))
