"""`pulsar_access.readers.has_message_available`: the client binding's answer, or `NotAnswered`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pulsar
import pytest

from pulsar_access.readers import NotAnswered, has_message_available


class Binding:
    """`pulsar.Reader._reader`: calls back with `answer`, or never (None)."""

    def __init__(self, answer: tuple[Any, bool] | None) -> None:
        self.answer = answer

    def has_message_available_async(self, callback: Callable[[Any, bool], None]) -> None:
        if self.answer is not None:
            callback(*self.answer)


class Reader:
    def __init__(self, answer: tuple[Any, bool] | None) -> None:
        self._reader = Binding(answer)

    def has_message_available(self) -> bool:
        return False  # what the client answers when the broker did not: never asked by the helper


@pytest.mark.parametrize("available", [True, False])
def test_the_brokers_answer_is_given_back(available: bool) -> None:
    assert has_message_available(Reader((pulsar.Result.Ok, available))) is available


def test_a_failed_question_raises_a_connect_error_that_names_the_result() -> None:
    with pytest.raises(pulsar.ConnectError, match="asking whether more is there failed: Timeout"):
        has_message_available(Reader((pulsar.Result.Timeout, False)))


def test_a_question_never_answered_raises_at_the_limit() -> None:
    with pytest.raises(NotAnswered, match="no answer in 0 s"):
        has_message_available(Reader(None), limit_s=0.05)


def test_a_reader_without_the_binding_is_asked_the_plain_way() -> None:
    class Plain:
        def has_message_available(self) -> bool:
            return True

    assert has_message_available(Plain()) is True
