"""A reader whose connection is cut while it asks whether more is there (through tests/loopback_proxy.py).

The client (pulsar-client 3.13) answers "no more" then; `pulsar_access.readers.has_message_available`
must say the broker did not answer, or a fold, a consumer's catch-up and a Spark batch end short.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pulsar
import pytest

from pulsar_access.readers import NotAnswered, has_message_available
from tests.harness import GENERATOR_LISTENER, RunningPulsar
from tests.loopback_proxy import GeneratorLink


@pytest.fixture
def link(pulsar_broker: RunningPulsar) -> Iterator[GeneratorLink]:
    if pulsar_broker.generator_listener_port is None:
        pytest.skip("needs the local standalone's second listener (not a container or PULSAR_SERVICE_URL)")
    link = GeneratorLink.start(pulsar_broker.settings, pulsar_broker.generator_listener_port, GENERATOR_LISTENER)
    yield link
    link.close()


def test_asking_for_more_while_the_connection_is_reset_raises_instead_of_answering_no(
    link: GeneratorLink, pulsar_client: pulsar.Client, namespace: str
) -> None:
    topic = f"persistent://{namespace}/cut-ask"
    producer = pulsar_client.create_producer(topic)
    sent = [producer.send(b"m%d" % i) for i in range(5)]
    producer.close()
    client = link.settings.client()
    try:
        reader = client.create_reader(topic, sent[0], start_message_id_inclusive=False)
        assert has_message_available(reader)
        read = [reader.read_next(10_000).data() for _ in range(4)]
        assert read == [b"m1", b"m2", b"m3", b"m4"]
        link.stall()
        outcome: list[object] = []
        asking = threading.Thread(target=lambda: outcome.append(_ask(reader)))
        asking.start()
        asking.join(2.0)  # the question waits on the stalled connection
        assert asking.is_alive()
        link.reset()
        link.resume()
        asking.join(60)
        assert len(outcome) == 1 and isinstance(outcome[0], NotAnswered), outcome
        assert "asking whether more is there failed" in str(outcome[0])
        assert _answer_once_reconnected(reader) is False  # the broker answers, and truly nothing more
    finally:
        client.close()


def _answer_once_reconnected(reader: pulsar.Reader, limit_s: float = 60.0) -> bool:
    """The reader's answer once its connection is back; until then the client fails the question too
    (BrokerMetadataError or a disconnect, seen in CI), which is `NotAnswered` again, not "no more"."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            return has_message_available(reader)
        except NotAnswered:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _ask(reader: pulsar.Reader) -> object:
    try:
        return has_message_available(reader)
    except Exception as exc:
        return exc
