"""The W_SNAPSHOT format (watermark_core.snapshot): layout, round trip, the chain, signatures, what is rejected."""

from __future__ import annotations

import msgpack
import pytest

from watermark_core.protocol import (
    MARKER_PROPERTY,
    SNAPSHOT_PRODUCER_PREFIX,
    MalformedMarker,
    Marker,
    decode_marker,
    pack,
)
from watermark_core.snapshot import (
    BAD_SIGNATURE,
    Snapshot,
    SnapshotKeys,
    decode_snapshot,
    encode_snapshot,
    is_generator_snapshot,
    state_to_dict,
)
from watermark_core.state import ProducerRecord, WatermarkConfig, WatermarkState

GENERATOR = f"{SNAPSHOT_PRODUCER_PREFIX}g1"
TOPIC = "persistent://public/default/t-partition-0"
KEYS = SnapshotKeys.from_text("a-key-only-generators-hold-0001")
OTHER_KEYS = SnapshotKeys.from_text("a-key-someone-else-made-00000002")


def snapshot_marker(payload: bytes, producer: str = GENERATOR, at: tuple[int, int, int] = (1, 9, -1)) -> Marker:
    marker = decode_marker({MARKER_PROPERTY: "W_SNAPSHOT"}, payload, producer, at, 10)
    assert marker is not None
    return marker


def a_state() -> WatermarkState:
    return WatermarkState.initial(WatermarkConfig(1_000, 2_000)).advanced_to((1, 4, -1))


def encode(state: WatermarkState, previous: tuple[int, int, int] | None = None, keys: SnapshotKeys = KEYS) -> bytes:
    return encode_snapshot(state, previous, keys=keys, topic=TOPIC)


def decode(
    marker: Marker, config: WatermarkConfig | None = None, keys: SnapshotKeys = KEYS, topic: str = TOPIC
) -> Snapshot:
    return decode_snapshot(marker, config, keys=keys, topic=topic)


def test_the_payload_is_the_signed_state_map_its_topic_and_the_previous_position() -> None:
    state = a_state()
    outer = msgpack.unpackb(encode(state))
    assert set(outer) == {"v", "signed", "key", "mac"} and outer["key"] == KEYS.ids[0] and len(outer["mac"]) == 32
    assert msgpack.unpackb(outer["signed"]) == {"v": 1, "topic": TOPIC, "state": state_to_dict(state)}
    assert msgpack.unpackb(msgpack.unpackb(encode(state, (1, 2, -1)))["signed"])["previous"] == [1, 2, -1]


def test_a_snapshot_decodes_to_its_state_position_and_chain_link() -> None:
    state = a_state()
    first = decode(snapshot_marker(encode(state), at=(1, 5, -1)))
    second = decode(snapshot_marker(encode(state, (1, 5, -1)), at=(1, 9, -1)))
    assert (first.state, first.at, first.message, first.previous) == (state, (1, 4, -1), (1, 5, -1), None)
    assert second.previous == (1, 5, -1) and second.message == (1, 9, -1)


def test_the_readers_config_replaces_the_recorded_one() -> None:
    config = WatermarkConfig(5, 6)
    assert decode(snapshot_marker(encode(a_state())), config).state.config == config


@pytest.mark.parametrize(
    "body",
    [
        {"v": 1, "topic": TOPIC, "state": state_to_dict(WatermarkState.initial())},  # states no position
        {"v": 1, "topic": TOPIC, "state": [1, 2]},
        {"v": 1, "topic": TOPIC},
        {"v": 1, "topic": TOPIC, "state": state_to_dict(a_state()), "previous": [1, "x", 2]},
        {"v": 1, "topic": TOPIC, "state": state_to_dict(a_state()), "previous": [1, 2]},
    ],
)
def test_what_is_not_a_usable_snapshot_is_bad_snapshot(body: dict[str, object]) -> None:
    """Signed, so written by a generator (say, of an incompatible version), but not a usable snapshot."""
    with pytest.raises(MalformedMarker) as caught:
        decode(snapshot_marker(KEYS.seal(msgpack.packb(body))))
    assert caught.value.reason == "bad-snapshot"


def test_only_a_generators_producer_name_makes_a_snapshot_a_candidate() -> None:
    payload = encode(a_state())
    assert is_generator_snapshot(snapshot_marker(payload))
    assert not is_generator_snapshot(snapshot_marker(payload, producer="mallory"))


# -- signatures: what a role that may only produce on the data topic can write --------------------------


def forged_state() -> WatermarkState:
    """What a forger wants a generator to restore: a producer far ahead, so the watermark jumps."""
    return WatermarkState(
        config=WatermarkConfig(60_000, 60_000), position=(1, 4, -1), clock=10, watermark=9_999_999_999_999,
        producers={"alice": ProducerRecord(9_999_999_999_999, False, 10)}, pending_txns={},
    )  # fmt: skip


def bad_signature(payload: bytes, keys: SnapshotKeys = KEYS, topic: str = TOPIC) -> str:
    with pytest.raises(MalformedMarker) as caught:
        decode(snapshot_marker(payload), keys=keys, topic=topic)
    assert caught.value.reason == BAD_SIGNATURE
    return str(caught.value)


def test_an_unsigned_snapshot_under_the_generators_name_is_bad_signature() -> None:
    """The format before signatures, and what anyone with produce could write."""
    unsigned = msgpack.packb({"v": 1, "state": state_to_dict(forged_state())})
    assert "not signed" in bad_signature(unsigned)
    fake_mac = msgpack.packb({"v": 1, "signed": msgpack.packb({"v": 1}), "mac": "not bytes"})
    assert "not signed" in bad_signature(fake_mac)


def test_a_snapshot_signed_with_another_key_is_bad_signature_naming_both_keys() -> None:
    detail = bad_signature(encode(forged_state(), keys=OTHER_KEYS))
    assert OTHER_KEYS.ids[0] in detail and KEYS.ids[0] in detail


def test_a_changed_signed_body_or_mac_is_bad_signature() -> None:
    outer = msgpack.unpackb(encode(a_state()))
    body = msgpack.unpackb(outer["signed"])
    body["state"] = state_to_dict(forged_state())
    assert "no key" in bad_signature(msgpack.packb({**outer, "signed": msgpack.packb(body)}))
    flipped = bytes([outer["mac"][0] ^ 1]) + outer["mac"][1:]
    assert "no key" in bad_signature(msgpack.packb({**outer, "mac": flipped}))


def test_a_genuine_snapshot_copied_to_another_partition_is_bad_signature() -> None:
    """A role that may consume topic A and produce on B copies a real snapshot of A into B."""
    copied = encode_snapshot(forged_state(), keys=KEYS, topic="persistent://public/default/attackers-own-topic")
    assert "copied from elsewhere" in bad_signature(copied)
    assert decode(snapshot_marker(encode(a_state())), topic=TOPIC).state == a_state()


def test_rotation_the_first_key_signs_and_every_key_verifies() -> None:
    old = encode(a_state(), keys=KEYS)
    rotated = SnapshotKeys.from_text("a-brand-new-key-after-rotation-03\n\n  a-key-only-generators-hold-0001  \n")
    assert rotated.ids == (SnapshotKeys.from_text("a-brand-new-key-after-rotation-03").ids[0], KEYS.ids[0])
    assert decode(snapshot_marker(old), keys=rotated).state == a_state()  # old snapshots still verify
    new = encode(a_state(), keys=rotated)
    assert decode(snapshot_marker(new), keys=rotated).state == a_state()
    bad_signature(new, keys=KEYS)  # a generator that only has the old key cannot verify the new one
    bad_signature(old, keys=SnapshotKeys.from_text("a-brand-new-key-after-rotation-03"))  # old key dropped


def test_keys_are_long_enough_and_never_printed() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        SnapshotKeys.from_text("short")
    with pytest.raises(ValueError, match="needed"):
        SnapshotKeys.from_text(" \n ")
    assert "a-key-only" not in repr(KEYS) and KEYS.ids[0] in repr(KEYS)
    one, two = SnapshotKeys.random(), SnapshotKeys.random()
    assert one.ids != two.ids and len(one.keys[0]) == 64


def test_a_snapshot_names_the_incarnation_of_its_topic_and_one_of_before_names_none() -> None:
    state = a_state()
    payload = encode_snapshot(state, keys=KEYS, topic=TOPIC, incarnation="0123abcd")
    assert decode(snapshot_marker(payload, at=(1, 5, -1))).incarnation == "0123abcd"
    assert decode(snapshot_marker(encode(state), at=(1, 5, -1))).incarnation is None  # older generators' snapshots


def test_a_snapshot_names_the_creation_time_of_its_topic_and_one_of_before_names_none() -> None:
    state = a_state()
    payload = encode_snapshot(state, keys=KEYS, topic=TOPIC, created=1_700_000_000_000)
    assert decode(snapshot_marker(payload, at=(1, 5, -1))).created == 1_700_000_000_000
    assert decode(snapshot_marker(encode(state), at=(1, 5, -1))).created == 0  # unknown
    signed = pack({"topic": TOPIC, "state": state_to_dict(state), "created": "yesterday"})
    with pytest.raises(MalformedMarker, match="created must be a creation time"):
        decode(snapshot_marker(KEYS.seal(signed), at=(1, 5, -1)))
