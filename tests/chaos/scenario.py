"""Runs one planned scenario on a real cluster and checks what the listeners saw.

Producers are honest: each asserts `W_SET(clock - disorder)` and then only sends event times in
`[clock - disorder, clock]` of a shared, rising clock, so no message of theirs may ever be handed
over after a watermark above its event time. Faults run one after another while they produce.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import pulsar

from consumer import Watermark, WatermarkConsumer, WatermarkListener
from devtools.broker_cluster import MultiBrokerCluster
from producer import WatermarkProducer
from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.readers import NotAnswered
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import namespace_of
from tests.chaos.checker import (
    Delivery,
    InstanceLog,
    Violation,
    WatermarkSeen,
    WatermarkWithdrawn,
    check_final,
    check_subscription,
)
from tests.chaos.crashes import forgive_lost_acknowledgements
from tests.chaos.oracle import judge_scenario
from tests.chaos.plan import Fault, FaultKind, ProducerPlan, ScenarioPlan
from tests.integration.generator_process import GeneratorProcess
from tests.integration.helpers import TopicEvents, watermark_table_reader
from tests.loopback_proxy import GeneratorLink
from tests.oracle import OracleReport
from watermark_core.protocol import EVENT_PROPERTY, SEND_WATERMARK, decode_table

log = logging.getLogger(__name__)

FINAL_BOUND_S = 60.0
"""How long after the faults stop every live consumer may take to see the final watermark."""
SEEK_RECOMPUTE_BOUND_S = 60.0
FAILURES = Path(__file__).resolve().parents[2] / ".chaos-failures"
"""Where a scenario with violations leaves its generator log and listener timelines."""


def suite_client(settings: PulsarSettings, log_dir: Path) -> pulsar.Client:
    """A client whose log goes to `log_dir/clients.log`: broker restarts make every client log its
    reconnect attempts, which would drown the suite's own output."""
    logger = pulsar.FileLogger(pulsar.LoggerLevel.Warn, str(log_dir / "clients.log"))
    return settings.client(operation_timeout_seconds=30, logger=logger)


@dataclass
class Cluster:
    """The real cluster a scenario runs on; `restart_broker` is None where we cannot restart it."""

    settings: PulsarSettings
    client: pulsar.Client
    admin: PulsarAdmin
    log_dir: Path
    restart_broker: Callable[[], None] | None = None
    broker_lock: threading.Lock = field(default_factory=threading.Lock)
    keep_history: bool = True
    """The suite's namespace keeps every message (retention), and the oracle judges every scenario."""
    kill_broker: Callable[[], None] | None = None
    """`kill -9` of the broker; None where we cannot. `start_broker` starts it again on the same data."""
    start_broker: Callable[[], None] | None = None
    broker_kills: list[float] = field(default_factory=list)
    """When the broker was killed (monotonic): every scenario running then lived through it."""
    generator_link: GeneratorLink | None = None
    """The generators' route to the broker through proxies a cut stalls; None: they connect directly."""
    several: MultiBrokerCluster | None = None
    """The cluster of several brokers the run started, whose topics the faults move; None: one broker."""

    def new_client(self) -> pulsar.Client:
        """A client of its own, as a separate consumer process would have."""
        return suite_client(self.settings, self.log_dir)


@dataclass
class Instance:
    """A live consumer instance: its own client (its process), the consumer and its listener."""

    client: pulsar.Client
    consumer: WatermarkConsumer
    listener: ChaosListener


@dataclass
class ScenarioResult:
    seed: int
    faults: Counter[str]
    violations: list[Violation]
    messages: int
    recovery_s: float
    """The longest time any consumer took to see the final watermark after the faults stopped."""
    duration_s: float
    notes: list[str] = field(default_factory=list)
    oracle: OracleReport | None = None
    """Every watermark the generator published, against the log (None: history not kept, or an error)."""


T = TypeVar("T")


RETRY_S = 240.0
"""How long a scenario's own client calls are tried again. A standalone started again after a `kill -9` answered its
health check but could not create a ledger for about 110 s more ("Not enough non-faulty bookies available", its
bookie's registration coming and going), so a scenario subscribing to a new topic then failed at 120 s (session 20,
seed 643651)."""


def retried(action: Callable[[], T], what: str, within_s: float = RETRY_S) -> T:
    """What an operator's code does while the broker restarts (maybe for another scenario): try again."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return action()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} kept failing for {within_s:.0f} s: {exc!r}") from exc
            time.sleep(0.5)


def create_topic_once(admin: PulsarAdmin, topic: str) -> None:
    """Create `topic`; "already exists" is success: a create whose answer a broker kill cut off may have taken."""
    try:
        admin.create_topic(topic)
    except AdminError as exc:
        if exc.status != 409:
            raise


PRODUCER_SILENT_S = 50.0
"""A producer that wrote nothing for this long (wall time, below the generator's 60 s producer timeout on the
log's clock) may have been timed out: the contract makes its later messages below the watermark late, not a
premature watermark, so the premature check leaves it out (found on several brokers, seed 414054: a topic away
74 s after its broker was killed, one producer asserting first after it moved the watermark alone)."""
SEND_TIMEOUT_MS = 90_000
"""A producer's send that waits longer gives up, and the scenario sends again with a new producer. Longer
than any broker restart or failover here (a killed broker's bundles move after its 10 s session). Found
on several brokers (seed 24084): after a bundle split and an unload, a Pulsar C++ client producer
(pulsar-client 3.x) may never reconnect; its sends wait for ever and the broker lists no such
producer: a send that races an unload can be dropped by the broker without an answer (apache/pulsar#21134)."""
MOVE_SPACING_S = 1.0
"""The least time between two moves of one subscription with its consumers attached (see `move_back_attached`)."""
ACKNOWLEDGED_WAIT_S = 15.0
"""How long a move back waits for the subscription to have acknowledged something to move back over."""
STANDBY_QUEUED_S = 4.0
"""A new generator instance has asked for a topic's claim by then: its 2 s start window, a second's hold-off per
rank (broker_ext/claims.py), and its discovery."""


class ChaosListener(WatermarkListener):
    """Records deliveries and acknowledges after a random processing delay; a dead one ignores everything."""

    def __init__(
        self,
        log: InstanceLog,
        rng: random.Random,
        max_delay_s: float,
        ids: dict[str, pulsar.MessageId],
        publish_times: dict[str, int],
    ):
        self.log = log
        self.rng = rng
        self.max_delay_s = max_delay_s
        self.ids = ids
        self.publish_times = publish_times
        self.dead = False
        self.held: Watermark | None = None
        """The watermark last handed to this listener (`computed_at` as the consumer holds it, see `received`)."""

    def received(self, consumer: WatermarkConsumer, message: pulsar.Message) -> None:
        if self.dead:
            return
        if self.max_delay_s:
            time.sleep(self.rng.uniform(0, self.max_delay_s))
        payload = message.data().decode()
        self._restated(consumer)
        msg_id = message.message_id()
        position = (msg_id.partition(), msg_id.ledger_id(), msg_id.entry_id())
        self.log.events.append(
            Delivery(payload, message.producer_name(), message.event_timestamp(), time.monotonic(), position)
        )
        if self.dead:  # crashed while "processing": no acknowledgement
            return
        try:
            consumer.acknowledge(message)
        except pulsar.PulsarException:
            return
        self.log.acknowledged.add(payload)
        self.ids[payload] = msg_id
        self.publish_times[payload] = message.publish_timestamp()

    def received_watermark(self, consumer: WatermarkConsumer, watermark: Watermark) -> None:
        self.held = watermark
        if not self.dead:
            self.log.events.append(WatermarkSeen(watermark.event_time, time.monotonic(), watermark.computed_at))

    def watermark_withdrawn(self, consumer: WatermarkConsumer) -> None:
        self.held = None
        if not self.dead:
            self.log.events.append(WatermarkWithdrawn(time.monotonic()))

    def _restated(self, consumer: WatermarkConsumer) -> None:
        """Record a watermark recomputed at another position with the same event time.

        The consumer hands a listener each watermark once (equal event times are the same
        watermark), so after a move back whose recomputed value equals the old one the listener
        is not called, but the consumer then holds the value as computed at the earlier position
        (`get_last_watermark().computed_at`). The positional check (`check_stale`) must compare
        a message with that position, not with the one of the first hand-over (seed 2).
        """
        now = consumer.get_last_watermark()
        held = self.held
        if now is None or held is None or now.event_time != held.event_time or now.computed_at == held.computed_at:
            return
        self.held = now
        # Recorded even if the instance crashed meanwhile: the message that follows is recorded too, and was
        # handed over under this one (seeds 2 and 60559: a crash during the processing delay).
        self.log.events.append(WatermarkSeen(now.event_time, time.monotonic(), now.computed_at))


class Scenario:
    """One scenario: its topic, generator, producers, consumer instances and fault thread."""

    def __init__(self, cluster: Cluster, plan: ScenarioPlan, namespace: str) -> None:
        self.cluster = cluster
        self.plan = plan
        self.rng = random.Random(plan.seed * 7919 + 1)
        self.topic = f"persistent://{namespace}/chaos-{plan.seed}-{uuid.uuid4().hex[:6]}"
        link = cluster.generator_link
        self.generator = GeneratorProcess(
            link.settings if link else cluster.settings, cluster.log_dir / f"generator-{plan.seed}.log",
            f"chaos-{plan.seed}", log_level="DEBUG", WM_TOPICS=self.topic, WM_NAMESPACES="",
            **(link.environment if link else {}),
        )  # fmt: skip
        self.logs: list[InstanceLog] = []
        self.live: dict[tuple[int, int], Instance] = {}
        self.ids: list[dict[str, pulsar.MessageId]] = [{} for _ in plan.subscriptions]
        self.publish_times: list[dict[str, int]] = [{} for _ in plan.subscriptions]
        self.moved_at: list[float] = [float("-inf") for _ in plan.subscriptions]
        """When each subscription was last moved with its consumers attached (monotonic)."""
        self.epochs = [0 for _ in plan.subscriptions]
        self.sent: list[str] = []
        self.producers: dict[str, WatermarkProducer] = {}
        self.sent_lock = threading.Lock()
        self.assert_lock = threading.Lock()
        self.highest_assertion = 0
        self.faults: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self.notes: list[str] = []
        self.last_write: dict[str, float] = {}
        """Per producer, when its last send succeeded (monotonic)."""
        self.silent: set[str] = set()
        """Producers that wrote nothing for PRODUCER_SILENT_S at some point: no longer checked for premature."""
        self.t0 = time.monotonic()
        self.clock_base = int(time.time() * 1000)
        self.instance_count = 0
        self.phases: dict[str, float] = {}
        self.oracle: OracleReport | None = None
        self.standbys: list[GeneratorProcess] = []
        """Second instances started by `KILL_OWNER_WITH_STANDBY` (killed by the end of their fault)."""

    def now_ms(self) -> int:
        """The scenario's event-time clock: rises with monotonic time, never goes back."""
        return self.clock_base + int((time.monotonic() - self.t0) * 1000)

    # -- consumers --------------------------------------------------------------------------------

    def open_instance(self, slot: tuple[int, int]) -> None:
        """Start a consumer instance the way a process does: a client of its own, retried while the broker is away.

        A subscribe attempt that fails takes its client with it: the C++ client may have registered
        the consumer at the broker before the attempt failed, and on a Failover subscription such a
        consumer, which no listener drains, could become the active one.
        """
        sub = self.plan.subscriptions[slot[0]]
        self.instance_count += 1
        name = f"{sub.name}-c{slot[1]}-{self.instance_count}"
        instance_log = InstanceLog(sub.name, name, time.monotonic(), self.epochs[slot[0]])
        listener = ChaosListener(
            instance_log, random.Random(self.rng.random()), self.plan.max_processing_delay_s, self.ids[slot[0]],
            self.publish_times[slot[0]],
        )  # fmt: skip
        queue_size = self.rng.choice([5, 50, 500])

        def attempt() -> tuple[pulsar.Client, WatermarkConsumer]:
            client = self.cluster.new_client()
            try:
                consumer = WatermarkConsumer(
                    client, self.topic, sub.name, listener=listener,
                    consumer_type=pulsar.ConsumerType.Shared if sub.shared else pulsar.ConsumerType.Failover,
                    initial_position=pulsar.InitialPosition.Earliest, consumer_name=name,
                    receiver_queue_size=queue_size,
                )  # fmt: skip
            except BaseException:
                with contextlib.suppress(Exception):
                    client.close()
                raise
            return client, consumer

        client, consumer = retried(attempt, f"subscribing {name}")
        self.logs.append(instance_log)
        self.live[slot] = Instance(client, consumer, listener)

    def crash_instance(self, slot: tuple[int, int]) -> None:
        """A crash: the listener stops at once and the process's connection goes away, acknowledging nothing more."""
        instance = self.live.pop(slot)
        instance.listener.dead = True
        instance.listener.log.closed = time.monotonic()
        with contextlib.suppress(Exception):
            instance.client.close()
        with contextlib.suppress(Exception):  # releases the wrapper's reader and listener thread
            instance.consumer.close()

    # -- producers --------------------------------------------------------------------------------

    def produce(self, plan: ProducerPlan, ready: threading.Barrier) -> None:
        """One honest producer: after asserting t it never sends an event time below t.

        Its assertions never go down (`floor`), and when it joins or comes back from idle it asserts
        at least the highest assertion any producer made, so the watermark (the minimum over the
        active producers, at most that highest assertion) is never above its later messages.
        """
        rng = random.Random(self.plan.seed * 31 + int(plan.name[1:]))
        self.new_producer(plan.name)
        floor = self.join(plan, 0)
        ready.wait()
        use_txn = False
        for i in range(plan.messages):
            payload = f"{plan.name}:{i}"
            event_time = max(floor, self.now_ms() - rng.randint(0, plan.disorder_ms))
            self.send_message(plan.name, payload.encode(), event_time)
            with self.sent_lock:
                self.sent.append(payload)
            if (i + 1) % plan.watermark_every == 0:
                floor = max(floor, self.now_ms() - plan.disorder_ms)
                use_txn = plan.transactional and not use_txn
                with self.assert_lock:
                    if use_txn:  # tried once: a transaction that times out stays open (the generator drops it)
                        with contextlib.suppress(pulsar.Timeout):
                            producer = self.producers[plan.name]
                            txn = producer.new_transaction()
                            producer.new_watermark(txn).event_time(floor).send()
                            txn.commit() if rng.random() < 0.7 else txn.abort()
                    else:
                        self.assert_at(plan.name, floor)
                    self.highest_assertion = max(self.highest_assertion, floor)
            if plan.idle_after == i:
                self.surely(plan.name, lambda p: p.new_watermark().mark_idle().send())
                time.sleep(rng.uniform(0.1, 0.5))
                floor = self.join(plan, floor)
            time.sleep(self.plan.send_interval_s)

    def new_producer(self, name: str) -> WatermarkProducer:
        producer = retried(
            lambda: WatermarkProducer(
                self.cluster.client, self.topic, producer_name=name,
                send_timeout_millis=SEND_TIMEOUT_MS, batching_enabled=False, keepalive_interval_ms=None,
            ),
            f"creating producer {name}",
        )  # fmt: skip
        self.producers[name] = producer
        return producer

    def surely(self, name: str, send: Callable[[WatermarkProducer], object]) -> None:
        """`send` with producer `name` until it succeeds; after a send that timed out, with a new producer
        (what an application does with a producer that stopped reconnecting, see SEND_TIMEOUT_MS).
        Sending again may write a message twice: that is at least once, and still honest (nothing in
        between raised this producer's assertion)."""
        while True:
            try:
                send(self.producers[name])
                self._wrote(name)
                return
            except pulsar.Timeout:
                self.notes.append(f"producer {name}: a send timed out after {SEND_TIMEOUT_MS / 1000:.0f} s; re-created")
                with contextlib.suppress(Exception):
                    self.producers[name].close(idle=False)
                self.new_producer(name)

    def _wrote(self, name: str) -> None:
        now = time.monotonic()
        before = self.last_write.get(name)
        self.last_write[name] = now
        if before is not None and now - before > PRODUCER_SILENT_S and name not in self.silent:
            self.silent.add(name)
            self.notes.append(
                f"producer {name}: wrote nothing for {now - before:.0f} s (the generator may time it "
                "out: its later messages below the watermark are late); not checked for premature"
            )

    def send_message(self, name: str, payload: bytes, event_time: int) -> None:
        self.surely(name, lambda p: p.send(payload, event_timestamp=event_time))

    def assert_at(self, name: str, event_time: int) -> None:
        self.surely(name, lambda p: p.new_watermark().event_time(event_time).send())

    def join(self, plan: ProducerPlan, floor: int) -> int:
        """Become active: assert at least every assertion so far (in log order, hence the lock)."""
        with self.assert_lock:
            assertion = max(floor, self.now_ms() - plan.disorder_ms, self.highest_assertion)
            self.assert_at(plan.name, assertion)
            self.highest_assertion = max(self.highest_assertion, assertion)
        return assertion

    # -- faults -----------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        if fault.kind is FaultKind.KILL_GENERATOR:
            self.generator.kill()
            time.sleep(fault.down_s)
            self.generator.start()
        elif fault.kind is FaultKind.KILL_OWNER_WITH_STANDBY:
            self.kill_owner_with_standby(fault)
        elif fault.kind is FaultKind.CRASH_CONSUMER:
            slot = self.plan.consumer_slots()[fault.target]
            self.crash_instance(slot)
            time.sleep(fault.down_s)
            self.open_instance(slot)
        elif fault.kind is FaultKind.SEEK_BACK:
            if not self.seek_back(fault.target, fault.down_s):
                return
        elif fault.kind in (
            FaultKind.SEEK_ATTACHED_BY_ID, FaultKind.SEEK_ATTACHED_BY_TIME, FaultKind.RESET_CURSOR_ATTACHED
        ):  # fmt: skip
            if not self.move_back_attached(fault.kind, fault.target):
                return
        elif fault.kind is FaultKind.RESTART_BROKER:
            if self.cluster.restart_broker is None:
                return
            with self.marker_waiting(fault), self.cluster.broker_lock:
                self.cluster.restart_broker()
        elif fault.kind is FaultKind.KILL_BROKER:
            if not self.kill_broker():
                return
        elif fault.kind is FaultKind.CUT_GENERATOR:
            if not self.cut_generator(fault):
                return
        elif not self.cluster_fault(fault):  # the cluster kinds
            return
        self.faults[fault.kind.value] += 1

    def cluster_fault(self, fault: Fault) -> bool:
        """A fault of a cluster of several brokers: the topic unloaded, moved, its bundle split, its broker
        killed (the others take its bundles; it comes back after `down_s`), or the generator killed while
        the topic moves."""
        several, admin = self.cluster.several, self.cluster.admin
        if several is None:
            return False
        if fault.kind is FaultKind.UNLOAD_TOPIC:
            retried(lambda: admin.unload_topic(self.topic), "unloading the topic")
        elif fault.kind is FaultKind.SPLIT_BUNDLE:
            retried(lambda: admin.split_bundle(namespace_of(self.topic), admin.bundle_of(self.topic)), "splitting")
        elif fault.kind is FaultKind.MOVE_BUNDLE:
            self.move_elsewhere(several, fault.target)
        elif fault.kind is FaultKind.MOVE_WHILE_MARKER_WAITS:
            with self.marker_waiting(fault):
                self.move_elsewhere(several, fault.target)
        elif fault.kind is FaultKind.KILL_GENERATOR_DURING_MOVE:
            self.generator.kill()
            self.move_elsewhere(several, fault.target)
            time.sleep(fault.down_s)
            self.generator.start()
        elif fault.kind is FaultKind.KILL_OWNER_BROKER:
            with self.cluster.broker_lock:  # one broker down at a time: the other two serve
                victim = several.owner_index(admin, self.topic, timeout_s=60)
                several.kill_broker(victim)
                self.cluster.broker_kills.append(time.monotonic())
                killed = time.monotonic()
                heir = several.owner_index(admin, self.topic, timeout_s=90, other_than=victim)
                self.notes.append(f"killed broker {victim}, which owned the topic; broker {heir} took it after "
                                  f"{time.monotonic() - killed:.1f} s")  # fmt: skip
                time.sleep(fault.down_s)
                several.start_broker(victim)
        return True

    def kill_owner_with_standby(self, fault: Fault) -> None:
        """A second instance follows the topic and, once it has asked for the claim (its start window and its
        rank's hold-off), waits in Pulsar's queue; the owner is killed -9, so the standby takes over; the owner
        comes back after `down_s` and queues in turn (or takes the topic back, first in rank); then the standby is
        killed -9 too, and the owner has it again."""
        name = f"chaos-{self.plan.seed}-standby-{len(self.standbys)}"
        standby = GeneratorProcess(self.cluster.settings, self.cluster.log_dir / f"generator-{name}.log", name,
                                   log_level="DEBUG", WM_TOPICS=self.topic, WM_NAMESPACES="")  # fmt: skip
        self.standbys.append(standby)
        standby.start()
        try:
            time.sleep(STANDBY_QUEUED_S)
            self.generator.kill()
            time.sleep(fault.down_s)
            self.generator.start()
            time.sleep(STANDBY_QUEUED_S)
        finally:
            standby.kill()

    @contextlib.contextmanager
    def marker_waiting(self, fault: Fault) -> Iterator[None]:
        """One consumer crashed while the producers go on: the markers they send wait for its acknowledgement
        through what happens inside; then it comes back (and acknowledges them)."""
        slots = [slot for slot in self.plan.consumer_slots() if slot in self.live]
        if not slots:
            yield
            return
        slot = slots[fault.target % len(slots)]
        self.crash_instance(slot)
        time.sleep(0.3 + fault.down_s)  # markers are sent meanwhile
        try:
            yield
        finally:
            self.open_instance(slot)

    def move_elsewhere(self, several: MultiBrokerCluster, pick: int) -> None:
        took = time.monotonic()
        to = several.move_elsewhere(self.cluster.admin, self.topic, pick=pick)
        self.notes.append(f"moved to broker {to} in {time.monotonic() - took:.1f} s")

    def kill_broker(self) -> bool:
        """`kill -9` of the broker while the producers send: no shutdown, no flush; then a start on its data."""
        if self.cluster.kill_broker is None or self.cluster.start_broker is None:
            return False
        with self.cluster.broker_lock:
            self.cluster.kill_broker()
            self.cluster.broker_kills.append(time.monotonic())
            self.cluster.start_broker()
        return True

    def cut_generator(self, fault: Fault) -> bool:
        """Cut the generator off from the broker (its binary protocol and admin API) for `fault.down_s`, longer
        than its timeouts, while the producers and consumers carry on; then heal it, with the held connections
        flowing again or reset (`fault.target`)."""
        link = self.cluster.generator_link
        if link is None:
            return False
        with link.lock:
            held = link.stall()
            try:
                time.sleep(fault.down_s)
                if fault.target:
                    link.reset()
            finally:
                link.resume()
        healed = "reset" if fault.target else "resumed"
        self.notes.append(f"generator cut off for {fault.down_s:.1f} s ({held} connections held), then {healed}")
        return True

    def seek_back(self, index: int, down_s: float) -> bool:
        """Close the subscription's consumers, seek it back, wait for the recomputed watermark, reopen."""
        sub = self.plan.subscriptions[index]
        candidates = self.acknowledged_candidates(index)
        if not candidates:
            self.notes.append(f"seek of {sub.name} skipped: nothing acknowledged yet")
            return False
        _, target = self.rng.choice(candidates)
        slots = [slot for slot in self.plan.consumer_slots() if slot[0] == index]
        for slot in slots:
            self.crash_instance(slot)

        def seek() -> None:
            """A short-lived process of its own: if the seek fails, closing its client leaves no consumer behind."""
            client = self.cluster.new_client()
            try:
                seeker = client.subscribe(
                    self.topic, sub.name, consumer_name="seeker",
                    consumer_type=pulsar.ConsumerType.Shared if sub.shared else pulsar.ConsumerType.Failover,
                )  # fmt: skip
                seeker.seek(target)
            finally:
                with contextlib.suppress(Exception):
                    client.close()

        retried(seek, f"seeking {sub.name}")
        self.epochs[index] += 1
        moved_to = retried(lambda: self.cluster.admin.mark_delete_position(self.topic, sub.name), "reading stats")
        if not self.wait_recomputed(sub.name, moved_to):
            self.generator.dump_stacks()
            self.violations.append(Violation(
                "seek-not-recomputed", sub.name,
                f"no watermark at or before {moved_to} (seek to {target}) within {SEEK_RECOMPUTE_BOUND_S:.0f} s",
            ))  # fmt: skip
        time.sleep(down_s)
        for slot in slots:
            self.open_instance(slot)
        return True

    def acknowledged_candidates(self, index: int) -> list[tuple[str, pulsar.MessageId]]:
        """Messages of the subscription acknowledged and behind its mark-delete position: where to move back to.

        Waits up to `ACKNOWLEDGED_WAIT_S` for one: a move drawn early in a scenario, before the consumers
        acknowledged anything, would otherwise be skipped for a reason of timing alone.
        """
        sub = self.plan.subscriptions[index]
        deadline = time.monotonic() + ACKNOWLEDGED_WAIT_S
        while True:
            mark_delete = retried(
                lambda: self.cluster.admin.mark_delete_position(self.topic, sub.name), "reading stats"
            )
            candidates = sorted(
                (payload, msg_id) for payload, msg_id in list(self.ids[index].items())
                if (msg_id.ledger_id(), msg_id.entry_id()) <= mark_delete
            )  # fmt: skip
            if candidates or time.monotonic() >= deadline:
                return candidates
            time.sleep(0.5)

    def move_back_attached(self, kind: FaultKind, index: int) -> bool:
        """Move a subscription back while its consumers stay attached: one of them seeks (by message id
        or publish time), or an operator resets the cursor (either way). Nothing waits for the
        recomputed watermark: the listeners' logs show whether any message came under a stale one."""
        sub = self.plan.subscriptions[index]
        candidates = self.acknowledged_candidates(index)
        attached = [instance for slot, instance in self.live.items() if slot[0] == index]
        if not candidates or not attached:
            self.notes.append(f"{kind.value} on {sub.name} skipped: nothing acknowledged yet")
            return False
        payload, message_id = self.rng.choice(candidates)
        by_time = kind is FaultKind.SEEK_ATTACHED_BY_TIME or (
            kind is FaultKind.RESET_CURSOR_ATTACHED and self.rng.random() < 0.5
        )
        if by_time:
            # Not the topic's first millisecond: a seek by time to it lands on the first entry then, the first
            # producer's W_SET, before which no watermark exists, and the consumers rightly withdraw theirs (seed
            # 596821, session 20); the checks assume every position moved back to has one (`check_withdrawn`).
            times = self.publish_times[index]
            first = min(times.values())
            later = [p for p, _ in candidates if times[p] > first]
            by_time = bool(later)
            if by_time and times[payload] <= first:
                payload = later[0]
        target: int | pulsar.MessageId = self.publish_times[index][payload] if by_time else message_id
        # A consumer's seek followed within about 50 ms by a reset-cursor of its subscription leaves a
        # consumer with a small receiver queue without flow permits for good: a bug of the Pulsar C++
        # client (pulsar-client 3.13), reproduced with a plain pulsar.Consumer (seed 60559, DECISIONS.md
        # "Seeks with consumers attached"). Not ours to fix; moves of one subscription are spaced.
        time.sleep(max(0.0, self.moved_at[index] + MOVE_SPACING_S - time.monotonic()))
        if kind is FaultKind.RESET_CURSOR_ATTACHED:
            retried(lambda: self.cluster.admin.reset_cursor(self.topic, sub.name, target), f"resetting {sub.name}")
        else:
            seeker = self.rng.choice(attached)
            retried(lambda: seeker.consumer.seek(target), f"seeking {sub.name} from {seeker.listener.log.name}")
        self.moved_at[index] = time.monotonic()  # spaced from when this move returned
        return True

    def wait_recomputed(self, subscription: str, moved_to: tuple[int, int]) -> bool:
        """Wait until the subscription's watermark in the table is the one at or before its new position.

        `moved_to` is where the seek really put the cursor: Pulsar moves a seek into a deleted ledger
        on to the next valid position. The generator publishes only changes, so a seek it saw as a move
        forward (it had not polled the acknowledgements before it) to the same value publishes nothing:
        then the latest value is already right. The latest value counts only once the reader has
        caught up, never an older entry of the table's history.
        """
        reader = retried(lambda: watermark_table_reader(self.cluster.client, self.topic), "reading the watermark table")
        deadline = time.monotonic() + SEEK_RECOMPUTE_BOUND_S
        latest: tuple[int, int] | None = None
        try:
            while time.monotonic() < deadline:
                try:
                    message = reader.read_next(timeout_millis=200)
                except pulsar.Timeout:
                    message = None
                if message is not None and message.properties().get(EVENT_PROPERTY) == SEND_WATERMARK:
                    for event in decode_table(message.data()):
                        if event.subscription == subscription:
                            latest = (event.position[0], event.position[1])
                if latest is not None and latest <= moved_to and not _more_or_unanswered(reader):
                    return True
            return False
        finally:
            reader.close()

    def run_faults(self) -> None:
        for fault in self.plan.faults:
            delay = self.t_start + fault.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                self.inject(fault)
            except Exception as exc:  # a fault that could not be injected is a finding, not a crash of the suite
                self.violations.append(Violation("fault-failed", "-", f"{fault.kind.value}: {exc!r}"))
                log.exception("injecting %s failed", fault)

    # -- the whole run ----------------------------------------------------------------------------

    def run(self) -> ScenarioResult:
        started = time.monotonic()
        with self.cluster.broker_lock:  # not while another scenario restarts the broker
            pass
        retried(lambda: create_topic_once(self.cluster.admin, self.topic), "creating the topic")
        self.generator.start()
        try:
            for slot in self.plan.consumer_slots():
                self.open_instance(slot)
            ready = threading.Barrier(len(self.plan.producers) + 1)
            threads = [
                threading.Thread(target=self.produce, args=(p, ready), name=f"chaos-{p.name}", daemon=True)
                for p in self.plan.producers
            ]
            for thread in threads:
                thread.start()
            ready.wait(timeout=60)
            self.t_start = time.monotonic()
            self.phases["setup"] = self.t_start - started
            self.run_faults()
            for thread in threads:
                thread.join(timeout=300)  # a send may wait SEND_TIMEOUT_MS, then go again
            if not self.generator.running:
                self.generator.start()
            finishing = time.monotonic()
            self.phases["run"] = finishing - self.t_start
            recovery = self.finish()
            self.phases["finish"] = time.monotonic() - finishing
        finally:
            closing = time.monotonic()
            for slot in list(self.live):
                self.crash_instance(slot)
            for producer in self.producers.values():
                with contextlib.suppress(Exception):
                    producer.close(idle=False)
            self.generator.kill()
            with contextlib.suppress(Exception):
                self.cluster.admin.delete_topic(self.topic)
            self.phases["teardown"] = time.monotonic() - closing
        self.notes.append("phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items()))
        refused = sum(g.log_text().count("not using it") for g in (self.generator, *self.standbys))
        if self.violations or refused:
            self.notes.append(f"evidence kept in {self.keep_evidence()} ({refused} rebuilt states refused)")
        return ScenarioResult(
            self.plan.seed, self.faults, self.violations, len(self.sent), recovery,
            time.monotonic() - started, self.notes, self.oracle,
        )  # fmt: skip

    def finish(self) -> float:
        """Faults are over: a final watermark above everything; check that all of it arrives."""
        final = self.now_ms() + 3_600_000
        quiet = time.monotonic()
        for name in list(self.producers):
            self.assert_at(name, final)
        deadline = quiet + FINAL_BOUND_S
        reached: dict[str, float | None] = {}
        while time.monotonic() < deadline:
            reached = {
                listener.log.name: next(
                    (w.at - quiet for w in listener.log.watermarks() if w.event_time >= final), None
                )
                for listener in (instance.listener for instance in self.live.values())
            }
            if all(took is not None for took in reached.values()) and self.all_acknowledged():
                break
            time.sleep(0.1)
        for sub in self.plan.subscriptions:
            logs = [entry for entry in self.logs if entry.subscription == sub.name]
            self.violations += check_subscription(
                sub.name,
                self.after_broker_kills(sub.name, logs),
                self.sent,
                {p.name for p in self.plan.producers} - self.silent,
            )
            names = {entry.name for entry in logs}
            self.violations += check_final(
                sub.name, final, {n: t for n, t in reached.items() if n in names}, FINAL_BOUND_S
            )
            if not self.backlog_drains(sub.name):
                self.violations.append(Violation(
                    "message-lost", sub.name, f"backlog not empty at the end: {self.subscription_snapshot(sub.name)}"
                ))  # fmt: skip
                self.notes.append(f"{sub.name} at the end: {self.subscription_snapshot(sub.name)}")
        if self.cluster.keep_history:
            judging = time.monotonic()
            try:
                self.oracle, found = judge_scenario(
                    self.cluster.client, self.cluster.admin, self.topic, self.generator.watermark_config
                )
                self.violations += found
            except Exception as exc:  # the oracle failing is a finding, not a crash of the suite
                self.violations.append(Violation("oracle-failed", "-", repr(exc)))
                log.exception("the oracle failed on %s", self.topic)
            self.phases["oracle"] = time.monotonic() - judging
        return max((t for t in reached.values() if t is not None), default=0.0)

    def after_broker_kills(self, subscription: str, logs: list[InstanceLog]) -> list[InstanceLog]:
        """The logs as the checks must see them after broker kills (tests/chaos/crashes.py), saying what was dropped."""
        forgiven = forgive_lost_acknowledgements(logs, self.cluster.broker_kills)
        if forgiven.duplicates or forgiven.lowered_watermarks:
            self.notes.append(
                f"{subscription}: after a broker kill -9, {forgiven.duplicates} deliveries of acknowledged messages "
                f"again and {forgiven.lowered_watermarks} watermarks below the one seen before (acknowledgements the "
                "broker had not persisted)"
            )
        return forgiven.logs

    def keep_evidence(self) -> Path:
        """Copy the generator's log and what every listener saw to FAILURES/<seed> (the work dir is temporary)."""
        kept = FAILURES / str(self.plan.seed)
        kept.mkdir(parents=True, exist_ok=True)
        if self.generator.log_path.exists():
            shutil.copy(self.generator.log_path, kept / "generator.log")
        for i, standby in enumerate(self.standbys):
            if standby.log_path.exists():
                shutil.copy(standby.log_path, kept / f"generator-standby-{i}.log")
        listeners = [
            {"name": entry.name, "subscription": entry.subscription, "started": entry.started, "epoch": entry.epoch,
             "closed": entry.closed, "events": [asdict(event) for event in entry.events]}
            for entry in self.logs
        ]  # fmt: skip
        (kept / "listeners.json").write_text(json.dumps({"t0": self.t0, "instances": listeners}, indent=1))
        return kept

    def all_acknowledged(self) -> bool:
        wanted = set(self.sent)
        for sub in self.plan.subscriptions:
            acked: set[str] = set()
            for entry in self.logs:
                if entry.subscription == sub.name:
                    acked |= entry.acknowledged
            if not wanted <= acked or not self.backlog_empty(sub.name):
                return False
        return True

    def backlog_drains(self, subscription: str, within_s: float = 10.0) -> bool:
        """The generator's snapshots keep arriving (and being acknowledged), so allow a moment."""
        deadline = time.monotonic() + within_s
        while not self.backlog_empty(subscription):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def subscription_snapshot(self, subscription: str) -> str:
        """What the broker says of a stuck subscription: its consumers' permits and unacknowledged messages."""
        try:
            stats = self.cluster.admin.topic_stats(self.topic)["subscriptions"][subscription]
        except Exception as exc:
            return f"stats unavailable: {exc!r}"
        consumers = [
            {k: c.get(k) for k in ("consumerName", "availablePermits", "unackedMessages", "msgOutCounter")}
            for c in stats.get("consumers", [])
        ]
        return f"backlog {stats.get('msgBacklog')}, active {stats.get('activeConsumerName')}, consumers {consumers}"

    def backlog_empty(self, subscription: str) -> bool:
        stats = retried(lambda: self.cluster.admin.topic_stats(self.topic), "reading stats")
        return int(stats["subscriptions"][subscription]["msgBacklog"]) == 0


def run_scenario(cluster: Cluster, plan: ScenarioPlan, namespace: str) -> ScenarioResult:
    return Scenario(cluster, plan, namespace).run()


def _more_or_unanswered(reader: TopicEvents) -> bool:
    """Whether the reader may have more: a question the broker did not answer counts as "maybe"."""
    try:
        return reader.has_message_available()
    except NotAnswered:
        return True
