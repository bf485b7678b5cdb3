"""The marker protocol: payloads, validation, positions, topic names and SendWatermark events."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsar_access.topics import (
    COMPANION_GROUPS,
    base_topic_and_partition,
    companion_group,
    is_watermark_topic,
    watermark_topic_for,
)
from watermark_core.protocol import (
    EVENT_PROPERTY,
    HEAD_WATERMARK,
    MARKER_PROPERTY,
    PROTOCOL_VERSION,
    SEND_WATERMARK,
    HeadWatermark,
    MalformedMarker,
    Marker,
    MarkerKind,
    Watermark,
    WatermarkEvent,
    decode_event,
    decode_head,
    decode_marker,
    decode_table,
    decode_table_with_heads,
    encode_event,
    encode_head,
    encode_idle,
    encode_set,
    encode_table,
    encode_txn_abort,
    encode_txn_commit,
    entry_end,
    head_key,
    is_marker,
    key_topic,
    position_of,
    table_key,
)

pytestmark = pytest.mark.unit

AT = position_of(7, 3)


def pack(body: Any) -> bytes:
    return bytes(msgpack.packb(body, use_bin_type=True))


def decode(kind: str, payload: bytes, producer: str = "p1") -> Marker | None:
    return decode_marker({MARKER_PROPERTY: kind}, payload, producer, AT, 1_000)


def reason_of(kind: str, payload: bytes) -> str:
    with pytest.raises(MalformedMarker) as caught:
        decode(kind, payload)
    return caught.value.reason


# -- encoding --------------------------------------------------------------------------------------------


def test_payloads_are_versioned_msgpack_maps() -> None:
    assert msgpack.unpackb(encode_set(5)) == {"v": 1, "event_time": 5}
    assert msgpack.unpackb(encode_set(5, txn="t")) == {"v": 1, "event_time": 5, "txn": "t"}
    assert msgpack.unpackb(encode_idle()) == {"v": 1}
    assert msgpack.unpackb(encode_idle(txn="t")) == {"v": 1, "txn": "t"}
    assert msgpack.unpackb(encode_txn_commit("t")) == {"v": 1, "txn": "t"}
    assert msgpack.unpackb(encode_txn_abort("t")) == {"v": 1, "txn": "t"}
    assert PROTOCOL_VERSION == 1


@pytest.mark.parametrize("event_time", [-1, 2**63, True, 1.5, "5", None])
def test_encode_set_rejects_bad_event_times(event_time: Any) -> None:
    with pytest.raises(ValueError, match="event_time must be an int"):
        encode_set(event_time)


def test_encode_set_accepts_the_whole_range() -> None:
    assert decode(MarkerKind.W_SET, encode_set(2**63 - 1)) is not None
    assert decode(MarkerKind.W_SET, encode_set(0)) is not None


@pytest.mark.parametrize("txn", ["", 5, b"t"])
def test_encoders_reject_bad_txn_ids(txn: Any) -> None:
    for encode in (encode_txn_commit, encode_txn_abort, encode_idle):
        with pytest.raises(ValueError, match="non-empty str"):
            encode(txn)
    with pytest.raises(ValueError, match="non-empty str"):
        encode_set(1, txn=txn)


# -- decoding --------------------------------------------------------------------------------------------


def test_a_message_without_the_property_is_data() -> None:
    assert decode_marker({}, b"anything", "p1", AT, 1) is None
    assert decode_marker({"other": "W_SET"}, encode_set(1), "p1", AT, 1) is None
    assert not is_marker({"other": "x"})
    assert is_marker({MARKER_PROPERTY: "W_SET"})
    assert is_marker({MARKER_PROPERTY: "garbage"})  # still hidden from users, then counted as malformed


def expected(kind: MarkerKind, **fields: Any) -> Marker:
    return Marker(kind, "p1", AT, 1_000, **fields)


def test_decode_each_kind() -> None:
    assert decode(MarkerKind.W_SET, encode_set(42)) == expected(MarkerKind.W_SET, event_time=42)
    assert decode(MarkerKind.W_SET, encode_set(42, "t")) == expected(MarkerKind.W_SET, event_time=42, txn="t")
    assert decode(MarkerKind.W_IDLE, encode_idle()) == expected(MarkerKind.W_IDLE)
    assert decode(MarkerKind.W_IDLE, encode_idle("t")) == expected(MarkerKind.W_IDLE, txn="t")
    assert decode(MarkerKind.W_TXN_COMMIT, encode_txn_commit("t")) == expected(MarkerKind.W_TXN_COMMIT, txn="t")
    assert decode(MarkerKind.W_TXN_ABORT, encode_txn_abort("t")) == expected(MarkerKind.W_TXN_ABORT, txn="t")
    body = {"v": 1, "state": {"any": "map"}}
    assert decode(MarkerKind.W_SNAPSHOT, pack(body)) == expected(MarkerKind.W_SNAPSHOT, body=body)


def test_the_producer_is_the_pulsar_producer_name_never_a_payload_field() -> None:
    payload = pack({"v": 1, "event_time": 5, "producer": "someone-else", "producer_name": "x"})
    marker = decode(MarkerKind.W_SET, payload, producer="sensor-1")
    assert marker is not None
    assert marker.producer == "sensor-1"


def test_unknown_keys_are_ignored_for_forward_compatibility() -> None:
    marker = decode(MarkerKind.W_SET, pack({"v": 1, "event_time": 5, "future": [1, {"x": 2}]}))
    assert marker is not None
    assert marker.event_time == 5


def test_a_null_txn_means_no_transaction() -> None:
    marker = decode(MarkerKind.W_IDLE, pack({"v": 1, "txn": None}))
    assert marker is not None
    assert marker.txn is None


@pytest.mark.parametrize("kind", ["W_UNKNOWN", "w_set", "", "W_SET "])
def test_unknown_kinds(kind: str) -> None:
    assert reason_of(kind, encode_set(1)) == "bad-kind"


def test_a_non_string_kind_is_a_bad_kind() -> None:
    with pytest.raises(MalformedMarker) as caught:
        decode_marker({MARKER_PROPERTY: 5}, encode_set(1), "p", AT, 1)  # type: ignore[dict-item]
    assert caught.value.reason == "bad-kind"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "bad-msgpack"),
        (b"\xc1", "bad-msgpack"),
        (pack({"v": 1}) + b"\x00", "bad-msgpack"),
        (pack([1, 2]), "bad-payload"),
        (pack(5), "bad-payload"),
        (pack({"event_time": 5}), "bad-version"),
        (pack({"v": 2, "event_time": 5}), "bad-version"),
        (pack({"v": 0, "event_time": 5}), "bad-version"),
        (pack({"v": True, "event_time": 5}), "bad-version"),
        (pack({"v": "1", "event_time": 5}), "bad-version"),
        (pack({"v": 1}), "bad-field"),
        (pack({"v": 1, "event_time": -1}), "bad-field"),
        (pack({"v": 1, "event_time": 2**63}), "bad-field"),
        (pack({"v": 1, "event_time": True}), "bad-field"),
        (pack({"v": 1, "event_time": 1.0}), "bad-field"),
        (pack({"v": 1, "event_time": "5"}), "bad-field"),
        (pack({"v": 1, "event_time": 5, "txn": ""}), "bad-field"),
        (pack({"v": 1, "event_time": 5, "txn": 7}), "bad-field"),
    ],
)
def test_malformed_set_markers(payload: bytes, reason: str) -> None:
    assert reason_of(MarkerKind.W_SET, payload) == reason


def test_malformed_other_markers() -> None:
    assert reason_of(MarkerKind.W_TXN_COMMIT, pack({"v": 1})) == "bad-field"
    assert reason_of(MarkerKind.W_TXN_ABORT, pack({"v": 1, "txn": None})) == "bad-field"
    assert reason_of(MarkerKind.W_IDLE, pack({"v": 1, "txn": b"t"})) == "bad-field"


def test_a_payload_that_is_not_bytes_is_malformed() -> None:
    with pytest.raises(MalformedMarker) as caught:
        decode(MarkerKind.W_SET, "text")  # type: ignore[arg-type]
    assert caught.value.reason == "bad-payload"


def test_bytes_like_payloads_are_accepted() -> None:
    assert decode(MarkerKind.W_SET, bytearray(encode_set(3))) is not None  # type: ignore[arg-type]
    assert decode(MarkerKind.W_SET, memoryview(encode_set(3))) is not None  # type: ignore[arg-type]


def test_malformed_marker_is_a_value_error_with_a_reason() -> None:
    error = MalformedMarker("bad-field", "detail")
    assert isinstance(error, ValueError)
    assert error.reason == "bad-field"
    assert str(error) == "bad-field: detail"


# -- positions -------------------------------------------------------------------------------------------


def test_positions_compare_as_tuples() -> None:
    assert position_of(1, 2) == (1, 2, -1)
    assert position_of(1, 2, 5) == (1, 2, 5)
    assert position_of(1, 2) < position_of(1, 2, 0) < position_of(1, 3) < position_of(2, 0)


def test_entry_end_is_after_every_message_of_the_entry_and_before_the_next() -> None:
    end = entry_end(4, 9)
    assert position_of(4, 9) < end
    assert position_of(4, 9, 2**31 - 2) < end
    assert end < position_of(4, 10) < position_of(5, 0)


# -- topic names and events ------------------------------------------------------------------------------


WM = "persistent://public/__watermarks"


def _group(topic: str) -> int:
    return companion_group(base_topic_and_partition(topic)[0])


@pytest.mark.parametrize(
    ("topic", "companion"),
    [
        ("my-topic", f"{WM}/public~default~group-{_group('my-topic')}"),
        ("my-topic-partition-0", f"{WM}/public~default~group-{_group('my-topic')}"),
        ("t/n/x", f"{WM}/t~n~group-{_group('t/n/x')}"),
        ("persistent://t/n/x-partition-3", f"{WM}/t~n~group-{_group('t/n/x')}"),
        ("persistent://t/n/x-partition-x", f"{WM}/t~n~group-{_group('t/n/x-partition-x')}"),
        ("persistent://t.a/n.b/x~y.z", f"{WM}/t.a~n.b~group-{_group('t.a/n.b/x~y.z')}"),
        ("non-persistent://t/n/x", f"{WM}/~non-persistent~t~n~group-{_group('non-persistent://t/n/x')}"),
    ],
)
def test_the_companion_topic_is_in_the_watermark_namespace_and_names_tenant_namespace_and_group(
    topic: str, companion: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WM_WATERMARK_NAMESPACE", raising=False)
    assert watermark_topic_for(topic) == companion


def test_a_topics_group_is_a_fixed_hash_of_its_name_spread_over_the_groups() -> None:
    """Every process, whatever its Python, derives the same group (not `hash`, which is salted per process)."""
    assert companion_group("persistent://public/default/my-topic") == 1  # pinned: a change is a protocol change
    groups = Counter(companion_group(f"persistent://public/default/t-{i}") for i in range(1600))
    assert set(groups) == set(range(COMPANION_GROUPS)) and max(groups.values()) < 2 * 1600 / COMPANION_GROUPS


def test_the_watermark_namespace_comes_from_the_argument_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WM_WATERMARK_NAMESPACE", "wm-system/tables")
    group = _group("x")
    assert watermark_topic_for("x") == f"persistent://wm-system/tables/public~default~group-{group}"
    assert watermark_topic_for("x", "other/ns") == f"persistent://other/ns/public~default~group-{group}"
    for bad in ("public", "a/b/c", "a/b~c", "a/"):
        monkeypatch.setenv("WM_WATERMARK_NAMESPACE", bad)
        with pytest.raises(ValueError, match=r"WM_WATERMARK_NAMESPACE .* must be 'tenant/namespace'"):
            watermark_topic_for("x")


# tenant and namespace names as Pulsar allows them ([-=:.\w]+), local names with '~' and '/'-free junk
_ENTITY = st.from_regex(r"[-=:.a-z0-9_]{1,6}", fullmatch=True)
_LOCAL = st.from_regex(r"[-=:.a-z0-9_~]{1,8}", fullmatch=True).filter(lambda s: "-partition-" not in s)


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["persistent", "non-persistent"]), _ENTITY, _ENTITY, _LOCAL), max_size=8))
def test_topics_of_two_namespaces_never_share_a_companion(names: list[tuple[str, str, str, str]]) -> None:
    by_companion: dict[str, set[tuple[str, str, str]]] = {}
    for d, t, n, x in names:
        by_companion.setdefault(watermark_topic_for(f"{d}://{t}/{n}/{x}", "public/__watermarks"), set()).add((d, t, n))
    assert all(len(namespaces) == 1 for namespaces in by_companion.values())


@pytest.mark.parametrize("topic", ["", "a/b", "a/b/c/d", "t//x"])
def test_bad_topic_names(topic: str) -> None:
    with pytest.raises(ValueError, match="not a topic name"):
        watermark_topic_for(topic)


def test_base_topic_and_partition() -> None:
    assert base_topic_and_partition("x") == ("persistent://public/default/x", -1)
    assert base_topic_and_partition("x-partition-12") == ("persistent://public/default/x", 12)
    assert base_topic_and_partition("persistent://t/n/x-partition-0") == ("persistent://t/n/x", 0)


def test_is_watermark_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WM_WATERMARK_NAMESPACE", raising=False)
    assert is_watermark_topic("persistent://public/default/x__watermarks")  # the old place: never followed either
    assert is_watermark_topic("x__watermarks-partition-2")
    assert is_watermark_topic(watermark_topic_for("y"))
    assert is_watermark_topic("persistent://public/__watermarks/anything")
    assert is_watermark_topic("persistent://o/n/y", "o/n")
    assert not is_watermark_topic("persistent://public/default/x")
    assert not is_watermark_topic("x__watermarks_not")


def test_tables_carry_every_subscription_of_a_partition_under_one_key() -> None:
    assert table_key("persistent://public/default/t", 3) == "persistent://public/default/t:3"
    assert table_key("persistent://public/default/t", -1) == "persistent://public/default/t:-1"
    other = WatermarkEvent("persistent://public/default/t", 2, "other", None, (1, 1), 4)
    assert decode_table(encode_table([EVENT, other])) == [EVENT, other]
    with pytest.raises(ValueError):
        encode_table([])
    for bad in ({}, {"events": []}, {"events": [1]}, {"events": [{"topic": "t"}]}):
        with pytest.raises(MalformedMarker) as caught:
            decode_table(msgpack.packb({"v": 1, **bad}))
        assert caught.value.reason == "bad-event"
    assert EVENT_PROPERTY == "wm.event"


def test_a_table_read_for_one_subscription_decodes_only_its_events() -> None:
    """A consumer's feed wants its own subscription's event of a table that lists every subscription of the
    partition (dozens on a busy topic): the others are neither built nor checked."""
    other = WatermarkEvent("persistent://public/default/t", 2, "other", None, (1, 1), 4)
    payload = encode_table([EVENT, other])
    assert decode_table(payload, subscription="other") == [other]
    assert decode_table(payload, subscription="nobody") == []
    ours = msgpack.unpackb(payload)["events"][0]
    broken = msgpack.packb({"v": 1, "events": [{"subscription": "other", "topic": 5}, ours]})
    assert decode_table(broken, subscription=EVENT.subscription) == [EVENT]
    with pytest.raises(MalformedMarker):
        decode_table(broken, subscription="other")
    with pytest.raises(MalformedMarker):
        decode_table(msgpack.packb({"v": 1, "events": [1]}), subscription="other")
    assert SEND_WATERMARK == "SendWatermark"


EVENT = WatermarkEvent("persistent://public/default/x", 2, "sub", 1_000, (5, 6), 9)


def test_events_round_trip() -> None:
    assert decode_event(encode_event(EVENT)) == EVENT
    no_watermark = WatermarkEvent("persistent://public/default/x", -1, "sub", None, (5, 6), 0)
    assert decode_event(encode_event(no_watermark)) == no_watermark


def test_encode_event_validates() -> None:
    with pytest.raises(ValueError, match="event_time"):
        encode_event(WatermarkEvent("t", 0, "s", -5, (1, 1), 0))
    with pytest.raises(ValueError, match="must be ints"):
        encode_event(WatermarkEvent("t", 0, "s", 5, (1, 1), "0"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"topic": ""}, "bad-event"),
        ({"subscription": None}, "bad-event"),
        ({"partition": -2}, "bad-event"),
        ({"partition": "1"}, "bad-event"),
        ({"seq": None}, "bad-event"),
        ({"event_time": -1}, "bad-event"),
        ({"event_time": False}, "bad-event"),
        ({"position": [1]}, "bad-event"),
        ({"position": [1, "2"]}, "bad-event"),
        ({"v": 2}, "bad-version"),
    ],
)
def test_malformed_events(change: dict[str, Any], reason: str) -> None:
    body = {**msgpack.unpackb(encode_event(EVENT)), **change}
    with pytest.raises(MalformedMarker) as caught:
        decode_event(pack(body))
    assert caught.value.reason == reason


def test_events_with_bad_bytes() -> None:
    with pytest.raises(MalformedMarker):
        decode_event(b"\xc1")
    with pytest.raises(MalformedMarker):
        decode_event(pack([]))


def test_watermark_is_what_listeners_receive() -> None:
    assert Watermark(5).event_time == 5
    assert Watermark(5) == Watermark(5)


def test_events_carry_the_producers_for_status() -> None:
    event = WatermarkEvent("persistent://public/default/t", 2, "s", 5, (1, 2), 3, {"a": 5, "b": 9}, ("c",), 1)
    assert decode_event(encode_event(event)) == event
    with pytest.raises(MalformedMarker):
        decode_event(msgpack.packb({**msgpack.unpackb(encode_event(event)), "active": {"a": "x"}}))


HEAD = HeadWatermark("persistent://public/default/x", 1, (12, 34), 1_700_000_000_000)


def test_head_events_round_trip_under_their_own_key_and_property() -> None:
    assert decode_head(encode_head(HEAD)) == HEAD
    assert msgpack.unpackb(encode_head(HEAD)) == {
        "v": 1, "topic": "persistent://public/default/x", "partition": 1, "position": [12, 34],
        "event_time": 1_700_000_000_000,
    }  # fmt: skip
    assert head_key(HEAD.topic, 1) == "head:persistent://public/default/x:1" != table_key(HEAD.topic, 1)
    assert head_key(HEAD.topic, -1) == "head:persistent://public/default/x:-1"
    assert HEAD_WATERMARK == "HeadWatermark"
    non_partitioned = HeadWatermark("persistent://public/default/x", -1, (0, 0), 0)
    assert decode_head(encode_head(non_partitioned)) == non_partitioned


def test_a_table_may_carry_its_partitions_head_events_so_one_message_says_both() -> None:
    heads = [HeadWatermark(EVENT.topic, EVENT.partition, (7, 9), 4_000), HeadWatermark(EVENT.topic, 2, (7, 11), 5_000)]
    assert decode_table_with_heads(encode_table([EVENT], heads)) == ([EVENT], heads)
    assert decode_table(encode_table([EVENT], heads)) == [EVENT]  # readers of tables alone read it as ever
    assert decode_table_with_heads(encode_table([EVENT])) == ([EVENT], [])
    for bad in ([{"topic": 1}], {"topic": "t"}):
        with pytest.raises(MalformedMarker) as caught:
            decode_table_with_heads(msgpack.packb({**msgpack.unpackb(encode_table([EVENT])), "heads": bad}))
        assert caught.value.reason == "bad-event"


def test_encode_head_validates() -> None:
    with pytest.raises(ValueError, match="event_time"):
        encode_head(HeadWatermark("t", 0, (1, 1), -1))
    with pytest.raises(ValueError, match="topic"):
        encode_head(HeadWatermark("", 0, (1, 1), 1))
    with pytest.raises(ValueError, match="must be ints"):
        encode_head(HeadWatermark("t", -2, (1, 1), 1))
    with pytest.raises(ValueError, match="must be ints"):
        encode_head(HeadWatermark("t", 0, (1, "1"), 1))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"topic": ""}, "bad-event"),
        ({"topic": 3}, "bad-event"),
        ({"partition": -2}, "bad-event"),
        ({"partition": True}, "bad-event"),
        ({"event_time": None}, "bad-event"),
        ({"event_time": 2**63}, "bad-event"),
        ({"position": [1, 2, 3]}, "bad-event"),
        ({"position": "1:2"}, "bad-event"),
        ({"v": 2}, "bad-version"),
    ],
)
def test_malformed_head_events(change: dict[str, Any], reason: str) -> None:
    body = {**msgpack.unpackb(encode_head(HEAD)), **change}
    with pytest.raises(MalformedMarker) as caught:
        decode_head(pack(body))
    assert caught.value.reason == reason


def test_a_table_is_not_a_head_event_and_a_head_event_not_a_table() -> None:
    with pytest.raises(MalformedMarker):
        decode_head(encode_table([EVENT]))
    with pytest.raises(MalformedMarker):
        decode_table(encode_head(HEAD))
    with pytest.raises(MalformedMarker):
        decode_head(b"\xc1")


def test_a_key_names_its_topic_so_a_reader_of_a_shared_companion_skips_the_others_unread() -> None:
    """Issue 47, grouped companion topics: compaction keeps the latest per key, so a key names topic and partition."""
    a, b = "persistent://public/default/a", "persistent://public/default/a:b"  # ':' may be in a topic's name
    keys = {table_key(t, p) for t in (a, b) for p in (-1, 0, 1)} | {head_key(t, p) for t in (a, b) for p in (-1, 0, 1)}
    assert len(keys) == 12
    assert {key_topic(table_key(a, p)) for p in (-1, 0, 7)} == {a} == {key_topic(head_key(a, p)) for p in (-1, 3)}
    assert key_topic(table_key(b, 2)) == b == key_topic(head_key(b, -1))
    for older in ("3", "-1", "head-3", "head--1", "", "head:", "x:y"):  # keys of generators before issue 47
        assert key_topic(older) is None
