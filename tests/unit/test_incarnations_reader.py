"""What a reader of companion topics says when it cannot read a topic's incarnation (pulsar_access/incarnations.py).

No broker: the admin API is a closed local port (a real refused connection), or absent. An admin API that does
not know the topic (another cluster's) is the real broker's answer, in tests/integration/test_errors.py.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import replace

import pytest

from pulsar_access.admin import PulsarAdmin
from pulsar_access.incarnations import Incarnations
from pulsar_access.settings import PulsarSettings

pytestmark = pytest.mark.unit

TOPIC = "persistent://public/default/t"


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_consumer_left_on_the_default_admin_url_is_quiet_until_its_topic_changes_incarnation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reader `Incarnations.for_consumer` makes without admin_url or PULSAR_ADMIN_URL: the default URL, which
    the user did not name (`named=False`), here on a port where nothing listens."""
    settings = replace(PulsarSettings.from_env(), admin_url=_closed_port_url())
    incarnations = Incarnations(PulsarAdmin(settings), reader="subscription 's'", named=False, owns_admin=True)
    try:
        with caplog.at_level(logging.DEBUG, logger="pulsar_access.incarnations"):
            for partition in (0, 1):
                assert incarnations.holds(TOPIC, partition, "a") and incarnations.holds(TOPIC, partition, None)
            assert _warnings(caplog) == []  # the user asked for nothing: nothing to fix
            assert incarnations.holds(TOPIC, 1, "b")  # taken unchecked, as before incarnations
            assert incarnations.holds(TOPIC, 0, "c")
        (warning,) = _warnings(caplog)  # once: partition 1's topic was re-created, unseen
        assert "PULSAR_ADMIN_URL" in warning and "t-partition-1" in warning and "(a to b)" in warning
    finally:
        incarnations.close()


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_consumer_whose_named_admin_url_does_not_answer_says_so_once(
    how: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = _closed_port_url()
    if how == "environment":
        monkeypatch.setenv("PULSAR_ADMIN_URL", url)
    incarnations = Incarnations.for_consumer(url if how == "argument" else None, reader="subscription 's'")
    try:
        with caplog.at_level(logging.WARNING, logger="pulsar_access.incarnations"):
            assert all(incarnations.holds(TOPIC, p, "a") for p in (0, 1, 2))
        (warning,) = _warnings(caplog)
        assert "cannot read the topic property wm.incarnation" in warning and "PULSAR_ADMIN_URL" in warning
    finally:
        incarnations.close()


def test_a_reader_without_an_admin_api_takes_every_event(caplog: pytest.LogCaptureFixture) -> None:
    incarnations = Incarnations(None, named=False)
    with caplog.at_level(logging.WARNING):
        assert all(incarnations.holds(TOPIC, -1, token) for token in (None, "a", None))
    assert _warnings(caplog) == []
