"""What a reader of companion topics says when it cannot read a topic's incarnation (pulsar_access/incarnations.py).

No broker: the admin API is a closed local port (a real refused connection), a local HTTP server that knows
no topic, or absent.
"""

from __future__ import annotations

import http.server
import logging
import socket
import threading
from collections.abc import Iterator

import pytest

from pulsar_access.incarnations import Incarnations

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
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("pulsar_access.settings.DEFAULT_ADMIN_URL", _closed_port_url())
    monkeypatch.delenv("PULSAR_ADMIN_URL", raising=False)
    incarnations = Incarnations.for_consumer(None, reader="subscription 's'")
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


class _KnowsNoTopic(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def another_service() -> Iterator[str]:
    """Something else listening where a consumer looks for its admin API: it knows no topic (404)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KnowsNoTopic)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_admin_api_that_does_not_know_the_topic_is_not_taken_as_its_incarnation(
    another_service: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the chaos suite: a consumer on the default admin URL while another process answered there took
    "not found" as "no property", found every event's token stale and never had a watermark."""
    monkeypatch.setattr("pulsar_access.settings.DEFAULT_ADMIN_URL", another_service)
    monkeypatch.delenv("PULSAR_ADMIN_URL", raising=False)
    incarnations = Incarnations.for_consumer(None, reader="subscription 's'")
    try:
        with caplog.at_level(logging.WARNING):
            assert incarnations.holds(TOPIC, -1, "a") and incarnations.holds(TOPIC, -1, "a")
        assert _warnings(caplog) == []
    finally:
        incarnations.close()
    named = Incarnations.for_consumer(another_service, reader="subscription 's'")
    try:
        with caplog.at_level(logging.WARNING):
            assert named.holds(TOPIC, 0, "a")
        (warning,) = _warnings(caplog)
        assert "does not know the topic" in warning
    finally:
        named.close()
