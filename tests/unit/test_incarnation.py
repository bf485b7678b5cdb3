"""Which incarnation of a topic an event is about: the pure rule (watermark_core/incarnation.py) and the wire format."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watermark_core.incarnation import IncarnationCheck, Verdict, new_token
from watermark_core.protocol import (
    HeadWatermark,
    WatermarkEvent,
    decode_event,
    decode_head,
    encode_event,
    encode_head,
    pack,
    unpack,
)

pytestmark = pytest.mark.unit


def test_an_event_holds_only_when_its_token_is_the_topic_property() -> None:
    check = IncarnationCheck("new")
    assert check.judge("new") is Verdict.HOLDS
    assert check.judge(None) is Verdict.STALE  # from before the property was set
    assert check.judge("old") is Verdict.ASK
    assert check.learned("old", "new") is False
    assert check.judge("old") is Verdict.STALE  # asked once


def test_without_the_property_only_events_without_a_token_hold() -> None:
    check = IncarnationCheck(None)
    assert check.judge(None) is Verdict.HOLDS
    assert check.judge("old") is Verdict.ASK
    check.learned("old", None)
    assert check.judge("old") is Verdict.STALE


def test_a_token_claimed_after_the_first_read_holds_once_read_again_and_the_old_one_goes() -> None:
    check = IncarnationCheck(None)
    assert check.judge("new") is Verdict.ASK
    assert check.learned("new", "new") is True  # the reader drops what it kept of the old incarnation
    assert check.judge("new") is Verdict.HOLDS and check.judge(None) is Verdict.STALE


def test_a_reader_that_cannot_read_the_property_takes_every_event_as_before() -> None:
    check = IncarnationCheck(None, known=False)
    assert {check.judge(token) for token in (None, "a", "b")} == {Verdict.HOLDS}


@given(
    old=st.lists(st.text(min_size=1, max_size=4), max_size=5),
    claimed=st.booleans(),
    stream=st.lists(st.integers(min_value=-1, max_value=6), max_size=40),
)
def test_whatever_order_events_arrive_in_only_the_current_incarnations_hold(
    old: list[str], claimed: bool, stream: list[int]
) -> None:
    """Old incarnations' tokens (and untokened events) arrive in any order around the current one's; the reader
    reads the property after the first event (what the shells do). Exactly the current incarnation's events hold."""
    current = "current" if claimed else None
    tokens: list[str | None] = [None, *(f"old-{t}" for t in old), current]
    check: IncarnationCheck | None = None
    for index in stream:
        token = tokens[index % len(tokens)]
        if check is None:
            check = IncarnationCheck(current)  # read once the first event is there
        verdict = check.judge(token)
        if verdict is Verdict.ASK:
            assert token is not None
            check.learned(token, current)
            verdict = check.judge(token)
        assert (verdict is Verdict.HOLDS) == (token == current), (token, current)


def test_events_and_head_events_carry_the_token_and_older_ones_decode_without() -> None:
    event = WatermarkEvent("persistent://p/n/t", 0, "s", 5, (1, 2), 7, incarnation=new_token())
    assert decode_event(encode_event(event)) == event
    head = HeadWatermark("persistent://p/n/t", -1, (1, 2), 5, "abc")
    assert decode_head(encode_head(head)) == head
    older = pack({k: v for k, v in unpack(encode_head(head)).items() if k not in ("v", "incarnation")})
    assert decode_head(older).incarnation is None
    assert "incarnation" not in unpack(encode_event(WatermarkEvent("persistent://p/n/t", 0, "s", 5, (1, 2), 7)))
