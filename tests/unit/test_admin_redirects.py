"""The admin client follows a broker's redirect to a topic's owner, as Pulsar's own admin client does.

Two small HTTP servers on loopback stand in for two brokers' web ports at the HTTP level only (what a
307 looks like on the wire); the same calls run against a real multi-broker cluster in
tests/integration/test_multi_broker.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devtools.local_cluster import free_port
from pulsar_access.admin import AdminError, PulsarAdmin, admin_urls
from pulsar_access.settings import PulsarSettings


class _Broker:
    """An HTTP server that owns the topics named `owned`, redirecting the others to `other`."""

    def __init__(self, owned: set[str]) -> None:
        self.owned = owned
        self.other = ""
        self.requests: list[tuple[str, str, str | None, bytes]] = []
        broker = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                broker.requests.append((self.command, self.path, self.headers.get("Authorization"), body))
                topic = self.path.split("?")[0].split("/")[6] if self.path.count("/") >= 6 else ""
                if topic and topic not in broker.owned:
                    self.send_response(307)
                    self.send_header("Location", broker.other + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                answer = json.dumps({"served_by": broker.url, "auth": self.headers.get("Authorization")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = do_PUT = _serve

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def brokers() -> Iterator[tuple[_Broker, _Broker]]:
    first, second = _Broker({"a"}), _Broker({"b"})
    first.other, second.other = second.url, first.url
    yield first, second
    first.server.shutdown()
    second.server.shutdown()


def test_a_topic_of_another_broker_is_read_from_its_owner_with_the_same_credentials(
    brokers: tuple[_Broker, _Broker],
) -> None:
    first, second = brokers
    admin = PulsarAdmin(PulsarSettings(admin_url=first.url, auth_token="secret"))
    answer = admin.brief_stats("persistent://public/default/b")  # the keep-alive path
    assert answer["served_by"] == second.url
    assert answer["auth"] == "Bearer secret"
    answer = admin.topic_stats("persistent://public/default/b")  # the requests path
    assert answer["served_by"] == second.url
    assert answer["auth"] == "Bearer secret"


def test_a_write_keeps_its_method_and_body_through_the_redirect(brokers: tuple[_Broker, _Broker]) -> None:
    first, second = brokers
    PulsarAdmin(PulsarSettings(admin_url=first.url)).set_topic_retention("persistent://public/default/b", 5, 7)
    method, _, _, body = second.requests[-1]
    assert method == "POST"
    assert json.loads(body) == {"retentionTimeInMinutes": 5, "retentionSizeInMB": 7}


def test_the_owner_is_remembered_so_later_reads_skip_the_redirect(brokers: tuple[_Broker, _Broker]) -> None:
    first, second = brokers
    admin = PulsarAdmin(PulsarSettings(admin_url=first.url))
    for _ in range(3):
        admin.brief_stats("persistent://public/default/b")
    assert len(first.requests) == 1 and len(second.requests) == 3
    second.owned, first.owned = set(), {"b"}  # the topic moved back: the remembered broker redirects
    assert admin.brief_stats("persistent://public/default/b")["served_by"] == first.url


def test_a_list_of_admin_urls_goes_on_with_the_next_when_one_does_not_answer(
    brokers: tuple[_Broker, _Broker],
) -> None:
    first, _ = brokers
    dead = f"127.0.0.1:{free_port()}"
    admin = PulsarAdmin(PulsarSettings(admin_url=f"http://{dead},127.0.0.1:{first.port}"), timeout_s=2)
    assert admin.brief_stats("persistent://public/default/a")["served_by"] == first.url
    assert admin.base_url == first.url


def test_admin_url_lists_take_the_first_scheme() -> None:
    assert admin_urls("http://b1:8080,b2:8081/") == ["http://b1:8080", "http://b2:8081"]
    assert admin_urls("https://b1:8443") == ["https://b1:8443"]


def test_redirect_loops_end_with_a_clear_error(brokers: tuple[_Broker, _Broker]) -> None:
    first, second = brokers
    first.owned = second.owned = set()
    with pytest.raises(AdminError, match="redirects"):
        PulsarAdmin(PulsarSettings(admin_url=first.url)).brief_stats("persistent://public/default/b")


def test_metrics_are_read_from_every_broker_that_owns_a_topic_asked_about(brokers: tuple[_Broker, _Broker]) -> None:
    """On a cluster each broker's /metrics lists only its own topics (the generator's ack watch reads them)."""
    first, second = brokers
    admin = PulsarAdmin(PulsarSettings(admin_url=first.url))
    assert [json.loads(b)["served_by"] for b in admin.owners_metrics(["persistent://public/default/b"])] == [first.url]
    admin.fast_internal_stats("persistent://public/default/b")  # redirected: the owner is known from now on
    bodies = admin.owners_metrics(["persistent://public/default/a", "persistent://public/default/b"])
    assert sorted(json.loads(b)["served_by"] for b in bodies) == sorted([first.url, second.url])
