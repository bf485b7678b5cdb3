"""The plain client's floor under the generator in the burst (issue 33): `python -m bench.plain_floor NS PREFIX N`.

Per `W_SET` a generator cannot do less than this: receive the marker on a subscription of its own, acknowledge
it, and send one table to a topic the consumers read. This process does exactly that with pulsar-client at its
best (a message listener, cumulative acknowledgements, `send_async` without batching, like the generator's
tables) and nothing else: no fold, no cursor positions, no snapshots. bench/burst.py runs it on the burst's
topics after the generator, so the generator's CPU per `W_SET` stands beside what the client alone costs.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import pulsar

from pulsar_access.settings import PulsarSettings

TABLE = b"t" * 300
"""About a table's size in the burst: one subscription's event with its producer, position and token."""


SUBSCRIPTION = "plain-floor"
"""Its subscription on each data topic (the burst deletes it after each window, so the next starts at the tail)."""


def table_topic(namespace: str, prefix: str, i: int) -> str:
    return f"persistent://{namespace}/{prefix}-table-{i}"


def _listener(producer: pulsar.Producer) -> Callable[[pulsar.Consumer, pulsar.Message], None]:
    def sent(_result: pulsar.Result, _message_id: pulsar.MessageId) -> None:
        pass

    def received(consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        consumer.acknowledge_cumulative(message)
        producer.send_async(TABLE, sent)

    return received


def main(argv: list[str]) -> None:
    namespace, prefix, count = argv[0], argv[1], int(argv[2])
    client = PulsarSettings.from_env().client()
    for i in range(count):
        producer = client.create_producer(table_topic(namespace, prefix, i), batching_enabled=False)
        client.subscribe(f"persistent://{namespace}/{prefix}-{i}", SUBSCRIPTION,
                         consumer_type=pulsar.ConsumerType.Failover, message_listener=_listener(producer))  # fmt: skip
    print("ready", flush=True)
    sys.stdin.read()  # until the bench closes our stdin (or kills us)
    threading.Thread(target=client.close, daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
