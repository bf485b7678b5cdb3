"""Asking a Pulsar reader whether more is there, with an answer that can be trusted.

`pulsar.Reader.has_message_available()` (pulsar-client 3.13) answers False when the broker did not answer:
a connection reset while it waits for `getLastMessageId` reads as "nothing more". Every caller here acts
on "nothing more": the generator's fold ends there, the consumer takes its watermark as caught up, the
Spark source ends a batch. `has_message_available` below raises instead, so each of them tries again.
"""

from __future__ import annotations

import threading
from typing import Any

import pulsar

ASK_LIMIT_S = 60.0
"""How long `has_message_available` waits for the client's answer; the client gives up before that
(twice its operation timeout while it has no connection, or when its request times out)."""


class NotAnswered(pulsar.ConnectError):  # type: ignore[misc]  # pulsar's exception classes are untyped
    """The broker did not say whether more is there (the connection went, or the call timed out)."""


def has_message_available(reader: Any, limit_s: float = ASK_LIMIT_S) -> bool:
    """Whether `reader` has more to read; raises `NotAnswered` (a `pulsar.ConnectError`) when the broker did
    not answer, where the client's own call answers False. A reader without the client's asynchronous call
    (a test's fake) is asked the plain way."""
    inner = getattr(reader, "_reader", None)
    ask = getattr(inner, "has_message_available_async", None)
    if ask is None:
        return bool(reader.has_message_available())
    answered = threading.Event()
    answer: list[Any] = []

    def done(result: Any, available: bool) -> None:
        answer[:] = [result, available]
        answered.set()

    ask(done)
    if not answered.wait(limit_s):
        raise NotAnswered(f"asking whether more is there got no answer in {limit_s:.0f} s")
    result, available = answer
    if result != pulsar.Result.Ok:
        raise NotAnswered(f"asking whether more is there failed: {_result_name(result)}")
    return bool(available)


def _result_name(result: Any) -> str:
    """The client's name for a result; some (46, the connection went) have none in the Python enum."""
    name = getattr(result, "name", None)
    return str(name) if name and name != "???" else f"result {int(result)}"
