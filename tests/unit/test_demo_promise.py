"""The demo's promise curve: the minimum over active producers of their latest W_SET, as sent."""

from __future__ import annotations

import pytest

from demo.__main__ import promise_curve, promise_passed

pytestmark = pytest.mark.unit


def test_the_promise_is_the_minimum_over_active_producers_and_never_goes_back() -> None:
    sent: list[tuple[float, str, int | None]] = [
        (1.0, "a", 100), (2.0, "b", 50), (3.0, "a", 200), (4.0, "b", 150), (5.0, "b", None), (6.0, "b", 120),
    ]  # fmt: skip
    # a alone 100; b joins below (no step back); 150; b idle: a's 200; b back at 120: no step back
    assert promise_curve(sent) == [(1.0, 100), (4.0, 150), (5.0, 200)]
    assert promise_passed(promise_curve(sent), 150) == 4.0
    assert promise_passed(promise_curve(sent), 201) is None
