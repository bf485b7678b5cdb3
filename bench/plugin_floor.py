"""The plugin path's floor under the generator in the burst: `python -m bench.plugin_floor NS PREFIX`.

Per `W_SET`, a generator fed by the broker plugin cannot do less than this: take the plugin's long poll with the
intake (answers read as the generator's poll thread reads them), send one table per `W_SET` found as the generator
sends its tables (batched on a few group topics, keyed by the data topic), and move the `__wm_generator` cursor
inside the broker once a second. No engine, no fold, no snapshots, no metrics. bench/burst.py runs it on the
burst's topics before the generator, so the generator's CPU stands beside what the plugin path alone costs it, and
the broker's beside what that path costs the broker.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import pulsar

from bench.plain_floor import TABLE
from broker_ext.dispatch import BATCH_DELAY_MS
from broker_ext.intake.plugin_cursors import ACK_GATHER_S, GATHER_S, LONG_POLL_MS
from pulsar_access.admin import PulsarAdmin
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import COMPANION_GROUPS, companion_group

GROUPS = COMPANION_GROUPS
"""Group topics, as the watermark namespace's companion topics of one namespace."""


def group_topic(namespace: str, prefix: str, group: int) -> str:
    return f"persistent://{namespace}/{prefix}-floor-group-{group}"


def _sent(_result: pulsar.Result, _message_id: pulsar.MessageId) -> None:
    pass


def follow(admin: PulsarAdmin, broker: str, namespace: str, producers: list[pulsar.Producer],
           stop: threading.Event) -> None:  # fmt: skip
    """The long poll: a table per marker found, and the cursor moved past the markers once a second."""
    epoch, seq = "", -1
    acks: dict[str, tuple[int, int]] = {}
    acked_at = time.monotonic()
    while not stop.is_set():
        answer = admin.plugin_changes(broker, epoch, seq, 0 if seq < 0 else LONG_POLL_MS, [namespace], intake=True)
        epoch, seq = str(answer["epoch"]), int(answer["seq"])
        for topic, report in (answer.get("topics") or {}).items():
            found: list[dict[str, Any]] = (report.get("intake") or {}).get("found") or []
            for item in found:
                if item.get("marker") == "W_SET":
                    producer = producers[companion_group(topic)]
                    producer.send_async(TABLE, _sent, partition_key=topic)
                    ledger, entry, _ = item["at"]
                    acks[topic] = (ledger, entry)
        if acks and time.monotonic() - acked_at >= ACK_GATHER_S:
            admin.plugin_acknowledge(broker, acks)
            acks, acked_at = {}, time.monotonic()
        stop.wait(GATHER_S)


def main(argv: list[str]) -> None:
    namespace, prefix = argv[0], argv[1]
    settings = PulsarSettings.from_env()
    client, admin = settings.client(), PulsarAdmin(settings)
    broker = admin.admin_bases[0]  # the standalone: every topic is served there
    producers = [
        client.create_producer(
            group_topic(namespace, prefix, g), batching_enabled=True, batching_max_publish_delay_ms=BATCH_DELAY_MS
        )
        for g in range(GROUPS)
    ]  # batching, as the generator's companion producers
    stop = threading.Event()

    def polling() -> None:
        try:
            follow(admin, broker, namespace, producers, stop)
        except Exception as exc:  # the window's figure would be nothing's: the bench sees the exit
            print(f"bench.plugin_floor: {exc!r}", file=sys.stderr, flush=True)
            os._exit(1)

    poll = threading.Thread(target=polling, daemon=True)
    poll.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the bench closes our stdin (or kills us)
    stop.set()
    threading.Thread(target=client.close, daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
