"""The W_SNAPSHOT format (watermark_core.snapshot): layout, round trip, the chain, what is rejected."""

from __future__ import annotations

import msgpack
import pytest

from watermark_core.protocol import MARKER_PROPERTY, SNAPSHOT_PRODUCER_PREFIX, MalformedMarker, Marker, decode_marker
from watermark_core.snapshot import decode_snapshot, encode_snapshot, is_generator_snapshot, state_to_dict
from watermark_core.state import WatermarkConfig, WatermarkState

GENERATOR = f"{SNAPSHOT_PRODUCER_PREFIX}g1"


def snapshot_marker(payload: bytes, producer: str = GENERATOR, at: tuple[int, int, int] = (1, 9, -1)) -> Marker:
    marker = decode_marker({MARKER_PROPERTY: "W_SNAPSHOT"}, payload, producer, at, 10)
    assert marker is not None
    return marker


def a_state() -> WatermarkState:
    return WatermarkState.initial(WatermarkConfig(1_000, 2_000)).advanced_to((1, 4, -1))


def test_the_payload_is_the_state_map_and_the_previous_position() -> None:
    state = a_state()
    assert msgpack.unpackb(encode_snapshot(state)) == {"v": 1, "state": state_to_dict(state)}
    assert msgpack.unpackb(encode_snapshot(state, (1, 2, -1)))["previous"] == [1, 2, -1]


def test_a_snapshot_decodes_to_its_state_position_and_chain_link() -> None:
    state = a_state()
    first = decode_snapshot(snapshot_marker(encode_snapshot(state), at=(1, 5, -1)))
    second = decode_snapshot(snapshot_marker(encode_snapshot(state, (1, 5, -1)), at=(1, 9, -1)))
    assert (first.state, first.at, first.message, first.previous) == (state, (1, 4, -1), (1, 5, -1), None)
    assert second.previous == (1, 5, -1) and second.message == (1, 9, -1)


def test_the_readers_config_replaces_the_recorded_one() -> None:
    config = WatermarkConfig(5, 6)
    assert decode_snapshot(snapshot_marker(encode_snapshot(a_state())), config).state.config == config


@pytest.mark.parametrize(
    "body",
    [
        {"v": 1, "state": state_to_dict(WatermarkState.initial())},  # states no position
        {"v": 1, "state": [1, 2]},
        {"v": 1},
        {"v": 1, "state": state_to_dict(a_state()), "previous": [1, "x", 2]},
        {"v": 1, "state": state_to_dict(a_state()), "previous": [1, 2]},
    ],
)
def test_what_is_not_a_usable_snapshot_is_bad_snapshot(body: dict[str, object]) -> None:
    with pytest.raises(MalformedMarker) as caught:
        decode_snapshot(snapshot_marker(msgpack.packb(body)))
    assert caught.value.reason == "bad-snapshot"


def test_only_a_generators_producer_name_makes_a_snapshot_trusted() -> None:
    payload = encode_snapshot(a_state())
    assert is_generator_snapshot(snapshot_marker(payload))
    assert not is_generator_snapshot(snapshot_marker(payload, producer="mallory"))
