"""`python -m bench.generator_hot_path [rounds] [--profile]`: the generator's own Python per `W_SET`, without a broker.

The burst's shape (200 non-partitioned topics, one `W_SET` each per round, each acknowledged at once) fed to a real
`GeneratorService` through the plugin's path as the long poll would hand it: per round one answer telling every
topic's marker (its intake) and the application cursor moved past it, then the loop's posted work run here, on this
thread. The companion topics' producers are stand-ins whose `send_async` completes at once, so what is timed is the
generator's Python from the plugin's answer to the table handed to the client library: reading the answer into
events, the fold, the table and its encoding, the head pairing, the metrics, and a snapshot record every ten
`W_SET`s, as the burst writes them (encoded and signed here, handed to a stand-in of the plugin that writes every
one). Not in it: the long poll's HTTP and JSON (the poll thread), the snapshot requests (the pool's thread), and
the client library's own threads. `python -m bench burst` measures all of
it on a broker, against the plain client (docs/DECISIONS.md, session 28: the table's send costs the whole process
about 0.037 ms of the plain client's 0.092 ms per `W_SET`; this is the rest).

CPU time swings by a third between runs on a shared machine: compare a change against its parent in one sitting.
`--profile` adds a cProfile of the measured rounds, by cumulative time.
"""

from __future__ import annotations

import base64
import cProfile
import pstats
import sys
import time
from typing import Any

import pulsar

from broker_ext.cli import tune_gc
from broker_ext.config import GeneratorConfig
from broker_ext.service import GeneratorService
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import watermark_topic_for
from watermark_core.protocol import GENERATOR_SUBSCRIPTION, encode_set

TOPICS = 200
WARM_ROUNDS = 20
NAMESPACE = "bench/hot-path"
BROKER = "http://127.0.0.1:1"
LEDGER = 100
TOKEN = "0123456789abcdef"
SNAPSHOT_EVERY = 10  # messages: in the burst, the 10 s snapshot interval at one W_SET a second


class _Sent:
    """A companion producer's stand-in: every send succeeds at once (the callback posts to the loop, as the client's
    thread would)."""

    def send_async(self, _message: Any, callback: Any) -> None:
        callback(pulsar.Result.Ok, None)


class _Producer:
    def __init__(self) -> None:
        self._producer = _Sent()


def _written_by_the_plugin(_broker: str, records: dict[str, tuple[str, bytes]]) -> dict[str, str]:
    """The plugin's stand-in for the snapshot records (a request from the pool's thread): every one written."""
    return {topic: f"written {LEDGER} 0" for topic in records}


def _report(entry: int, event_time: int | None) -> dict[str, Any]:
    """One topic as the plugin tells it: the marker at `entry` found (if any) and the application past it."""
    report: dict[str, Any] = {
        "owner": None, "created": 1_700_000_000_000, "incarnation": TOKEN, "lastConfirmed": [LEDGER, entry],
        "ledgers": [[LEDGER, 0]], "cursors": {GENERATOR_SUBSCRIPTION: [LEDGER, -1], "app": [LEDGER, entry]},
    }  # fmt: skip
    if event_time is not None:
        payload = base64.b64encode(encode_set(event_time)).decode()
        marker = {"marker": "W_SET", "at": [LEDGER, entry, -1], "producer": "P", "payload": payload,
                  "publishTime": 1, "txn": False}  # fmt: skip
        report["intake"] = {"found": [marker], "scannedTo": [LEDGER, entry], "overflowed": False}
    return report


def _drain(service: GeneratorService) -> None:
    """Run what was posted to the (never started) loop, and the timers due, as its thread would."""
    loop = service.loop
    while True:
        loop._run_timers()
        try:
            work = loop._queue.get_nowait()
        except Exception:  # queue.Empty
            return
        work()


def main(argv: list[str]) -> int:
    """Prints the CPU per `W_SET`; returns how many topics ended with their last `W_SET` as their watermark."""
    rounds = int(argv[0]) if argv and argv[0].isdigit() else 500
    tune_gc()  # as `broker-ext serve` does: collections as rare as in the generator's process
    # the defaults (the plugin's intake, by claim) but a snapshot every ten W_SETs, as the burst writes them
    config = GeneratorConfig(namespaces=(NAMESPACE,), metrics_port=0, snapshot_interval_s=1e9,
                             snapshot_interval_messages=SNAPSHOT_EVERY)  # fmt: skip
    service = GeneratorService(config, PulsarSettings("pulsar://127.0.0.1:1", BROKER))
    cursors: Any = service.cursors
    cursors.admin.plugin_write_snapshots = _written_by_the_plugin
    cursors.write_gather_s = 0.0  # the rounds come faster than a burst's seconds: no gather across them
    topics = [f"persistent://{NAMESPACE}/t-{i}" for i in range(TOPICS)]
    try:
        # reported by a plugin before the generator follows them (their subscription in place): no follow request
        cursors._answered(BROKER, {"epoch": "e", "seq": 1, "full": True, "gone": [],
                                   "topics": {t: _report(-1, None) for t in topics}})  # fmt: skip
        service._follow(set(topics))
        for topic in topics:
            service._claim_gained(watermark_topic_for(topic), frozenset({topic}), _Producer())
        cursors._refetched(BROKER, {"topics": {t: {**_report(-1, None), "intake": {"found": [], "scannedTo": [
            LEDGER, -1], "overflowed": False}} for t in topics}}, set(topics))  # fmt: skip
        _drain(service)
        answers = [{"epoch": "e", "seq": round_ + 2, "full": False, "gone": [],
                    "topics": {t: _report(round_, 1_000 * (round_ + 1)) for t in topics}}
                   for round_ in range(WARM_ROUNDS + rounds)]  # fmt: skip
        profile = cProfile.Profile() if "--profile" in argv else None
        started = 0.0
        for round_, answer in enumerate(answers):
            if round_ == WARM_ROUNDS:
                started = time.thread_time()
                if profile is not None:
                    profile.enable()
            cursors._answered(BROKER, answer)
            _drain(service)
        spent = time.thread_time() - started
        if profile is not None:
            profile.disable()
        last = 1_000 * (WARM_ROUNDS + rounds)
        current = sum(
            service.metrics.registry.get_sample_value("wm_watermark_ms", {"topic": t, "partition": "-1",
                                                                          "subscription": "app"}) == last
            for t in topics
        )  # fmt: skip
        print(f"{TOPICS} topics, {rounds} rounds: {spent * 1e6 / (rounds * TOPICS):.1f} µs of this thread's CPU per "
              f"W_SET; topics whose last W_SET is their published watermark: {current} of {TOPICS}")  # fmt: skip
        if profile is not None:
            pstats.Stats(profile).sort_stats("cumulative").print_stats(35)
        return current
    finally:
        service.close()


if __name__ == "__main__":
    main(sys.argv[1:])
