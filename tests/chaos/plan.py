"""A scenario drawn from its seed (pure): who produces what, who consumes how, which faults when.

The same seed gives the same plan; the run itself also depends on timing (thread scheduling,
how long a restart takes), so a seed reproduces the scenario, not every interleaving.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    KILL_GENERATOR = "kill -9 generator"
    CRASH_CONSUMER = "crash consumer"
    SEEK_BACK = "seek subscription back"
    SEEK_ATTACHED_BY_ID = "seek by the consumer while attached, by message id"
    SEEK_ATTACHED_BY_TIME = "seek by the consumer while attached, by publish time"
    RESET_CURSOR_ATTACHED = "admin reset-cursor while consumers are attached"
    RESTART_BROKER = "restart broker while a marker waits"
    """A consumer is crashed first, so markers wait for its acknowledgement across the restart (the broker
    plugin's run starts over: its sequence, its topics), and comes back after."""
    KILL_BROKER = "kill -9 broker"
    CUT_GENERATOR = "cut generator off"
    # on a cluster of several brokers (`--cluster multi`) only
    UNLOAD_TOPIC = "unload the topic"
    MOVE_BUNDLE = "move the topic's bundle to another broker"
    SPLIT_BUNDLE = "split the topic's bundle"
    KILL_OWNER_BROKER = "kill -9 the broker that owns the topic"
    KILL_GENERATOR_DURING_MOVE = "kill -9 generator while its topic moves"
    KILL_OWNER_WITH_STANDBY = "kill -9 the owning generator while a standby waits"
    """A second generator instance follows the topic and waits in Pulsar's queue for its claim; the owner is
    killed, the standby takes over, the owner comes back (its queue's next), and the standby is killed too."""
    MOVE_WHILE_MARKER_WAITS = "move the topic while a marker waits"
    """A consumer is crashed first, so markers wait for its acknowledgement; the topic moves to another broker
    (whose plugin must report it) before it comes back and acknowledges there."""


SUBSCRIPTION_FAULTS = frozenset(
    {
        FaultKind.SEEK_BACK,
        FaultKind.SEEK_ATTACHED_BY_ID,
        FaultKind.SEEK_ATTACHED_BY_TIME,
        FaultKind.RESET_CURSOR_ATTACHED,
    }
)
"""Faults whose target is a subscription (the others': a consumer slot, or none)."""


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float
    """Seconds after the producers start; faults run one after another, never overlapping."""
    kind: FaultKind
    target: int
    """Which subscription (seeks, resets) or consumer slot (crash); for a cut, 1 if the connections are reset
    when it heals (0: they survive it); for a bundle move, which of the other brokers it goes to (modulo
    their number); unused otherwise."""
    down_s: float
    """How long the killed or crashed part stays away before it comes back (a killed broker: after its
    bundles went to the others)."""


@dataclass(frozen=True, slots=True)
class ProducerPlan:
    name: str
    messages: int
    disorder_ms: int
    """Event times lag the scenario clock by up to this much, in any order."""
    watermark_every: int
    idle_after: int | None
    """Send W_IDLE after this many messages, pause, then come back with a W_SET."""
    transactional: bool
    """Every other watermark goes through a watermark transaction, committed or aborted at random."""


@dataclass(frozen=True, slots=True)
class SubscriptionPlan:
    name: str
    shared: bool
    """Shared, else Failover."""
    consumers: int


@dataclass(frozen=True, slots=True)
class ScenarioPlan:
    seed: int
    producers: tuple[ProducerPlan, ...]
    subscriptions: tuple[SubscriptionPlan, ...]
    faults: tuple[Fault, ...]
    send_interval_s: float
    max_processing_delay_s: float

    def consumer_slots(self) -> list[tuple[int, int]]:
        """(subscription index, consumer index) of every consumer the scenario runs."""
        return [(s, c) for s, sub in enumerate(self.subscriptions) for c in range(sub.consumers)]


RESTART_SHARE = 0.04
"""The share of scenarios that restart the broker: each restart costs 10-40 s."""
KILL_SHARE = 0.03
"""The share of scenarios that `kill -9` the broker (and start it again on the same data)."""
CUT_SHARE = 0.04
"""The share of scenarios that cut the generator off from the broker for `CUT_S` seconds."""
CUT_S = (12.0, 35.0)
"""Longer than the generator's client operation and admin timeouts (10 s), sometimes past a keep-alive (30 s)."""
STANDBY_SHARE = 0.1
"""The share of scenarios where one `kill -9 generator` has a standby waiting (`KILL_OWNER_WITH_STANDBY`)."""
CLUSTER_FAULTS = (2, 4)
"""On several brokers: how many of a scenario's faults are a cluster's (moves, splits, a broker's death)."""
OWNER_KILL_SHARE = 0.2
"""On several brokers: the share of scenarios that kill -9 the topic's broker (each costs the metadata
store's session timeout, 10 s here, and a broker start, about 15 s)."""


def plan_scenario(
    seed: int,
    *,
    broker_restarts: bool = True,
    restart_share: float = RESTART_SHARE,
    kill_share: float = KILL_SHARE,
    cut_share: float = CUT_SHARE,
    standby_share: float = STANDBY_SHARE,
    generator_cuts: bool = True,
    several_brokers: bool = False,
    min_faults: int = 6,
    max_faults: int = 8,
) -> ScenarioPlan:
    """The plan of `seed`: the same seed and options give the same plan.

    `restart_share` is the chance that one of the faults is a broker restart; the producers and
    subscriptions do not depend on it (the fault schedule does). `kill_share` and `cut_share` add
    the hard faults (`with_hard_faults`) without changing any other draw of the plan. On
    `several_brokers` the standalone's broker faults give way to a cluster's (`with_cluster_faults`).
    """
    rng = random.Random(seed)
    producers = tuple(
        ProducerPlan(
            name=f"p{i}",
            messages=rng.randint(40, 120),
            disorder_ms=rng.choice([0, 200, 1_000, 3_000]),
            watermark_every=rng.randint(3, 15),
            idle_after=rng.randint(10, 30) if rng.random() < 0.4 else None,
            transactional=rng.random() < 0.3,
        )
        for i in range(rng.randint(2, 4))
    )
    subscriptions = (
        SubscriptionPlan("failover", shared=False, consumers=rng.randint(1, 2)),
        SubscriptionPlan("shared", shared=True, consumers=rng.randint(2, 3)),
    )
    slots = sum(sub.consumers for sub in subscriptions)
    kinds = [FaultKind.KILL_GENERATOR] * 3 + [FaultKind.CRASH_CONSUMER] * 4 + [FaultKind.SEEK_BACK]
    kinds += [FaultKind.SEEK_ATTACHED_BY_ID, FaultKind.SEEK_ATTACHED_BY_TIME, FaultKind.RESET_CURSOR_ATTACHED]
    chosen = [rng.choice(kinds) for _ in range(rng.randint(min_faults, max_faults))]
    if broker_restarts and rng.random() < restart_share:
        chosen[rng.randrange(len(chosen))] = FaultKind.RESTART_BROKER
    times = sorted(rng.uniform(0.2, 3.0) for _ in chosen)
    faults = tuple(
        Fault(
            at_s=round(at, 2),
            kind=kind,
            target=rng.randrange(len(subscriptions)) if kind in SUBSCRIPTION_FAULTS else rng.randrange(slots),
            down_s=round(rng.uniform(0.0, 0.8), 2),
        )
        for at, kind in zip(times, chosen, strict=True)
    )
    faults = with_standby(seed, faults, share=standby_share)
    faults = with_hard_faults(
        seed, faults, kill_share=kill_share if broker_restarts else 0.0, cut_share=cut_share if generator_cuts else 0.0
    )
    if several_brokers:
        faults = with_cluster_faults(seed, faults)
    return ScenarioPlan(
        seed=seed,
        producers=producers,
        subscriptions=subscriptions,
        faults=faults,
        send_interval_s=rng.choice([0.005, 0.01, 0.02]),
        max_processing_delay_s=rng.choice([0.0, 0.002, 0.01]),
    )


def with_hard_faults(seed: int, faults: tuple[Fault, ...], *, kill_share: float, cut_share: float) -> tuple[Fault, ...]:
    """`faults` with, at the chance of each share, one fault replaced by a `kill -9` of the broker and one by a
    cut of the generator (`CUT_S` seconds, then the connections survive or are reset).

    Drawn from a generator of their own, so a plan without them is the plan the seed always gave; a
    broker restart is never replaced.
    """
    rng = random.Random(seed * 1_000_003 + 15)
    faults_list = list(faults)
    for kind, share in ((FaultKind.KILL_BROKER, kill_share), (FaultKind.CUT_GENERATOR, cut_share)):
        hit, where = rng.random() < share, rng.random()
        down_s, reset = round(rng.uniform(*CUT_S), 1), rng.randrange(2)
        replaceable = [
            i for i, f in enumerate(faults_list) if f.kind not in (FaultKind.RESTART_BROKER, FaultKind.KILL_BROKER)
        ]
        if hit and replaceable:
            index = replaceable[int(where * len(replaceable))]
            cut = kind is FaultKind.CUT_GENERATOR
            faults_list[index] = Fault(faults_list[index].at_s, kind, reset if cut else 0, down_s if cut else 0.0)
    return tuple(faults_list)


def with_standby(seed: int, faults: tuple[Fault, ...], *, share: float) -> tuple[Fault, ...]:
    """`faults` with, at the chance of `share`, one `kill -9 generator` made a kill while a standby waits; drawn
    from a generator of its own (as `with_hard_faults`)."""
    rng = random.Random(seed * 1_000_003 + 43)
    hit, where = rng.random() < share, rng.random()
    kills = [i for i, f in enumerate(faults) if f.kind is FaultKind.KILL_GENERATOR]
    if not hit or not kills:
        return faults
    index = kills[int(where * len(kills))]
    faults_list = list(faults)
    kill = faults_list[index]
    faults_list[index] = Fault(kill.at_s, FaultKind.KILL_OWNER_WITH_STANDBY, kill.target, kill.down_s)
    return tuple(faults_list)


def with_cluster_faults(seed: int, faults: tuple[Fault, ...]) -> tuple[Fault, ...]:
    """`faults` with `CLUSTER_FAULTS` of them replaced by a cluster's: unloads, bundle moves (to a broker the
    run picks), splits, a generator killed while its topic moves, and at `OWNER_KILL_SHARE` a kill -9 of the
    broker that owns the topic, which comes back after `down_s`.

    Drawn from a generator of their own (as `with_hard_faults`), and never replacing a standalone
    broker restart, kill or cut (a multi-broker run plans none of those).
    """
    rng = random.Random(seed * 1_000_003 + 29)
    moves = [FaultKind.UNLOAD_TOPIC, FaultKind.MOVE_BUNDLE, FaultKind.MOVE_BUNDLE, FaultKind.SPLIT_BUNDLE]
    moves += [FaultKind.KILL_GENERATOR_DURING_MOVE, FaultKind.MOVE_WHILE_MARKER_WAITS]
    faults_list = list(faults)
    replaceable = [i for i, f in enumerate(faults_list) if f.kind not in HARD_FAULTS]
    chosen = rng.sample(replaceable, min(len(replaceable), rng.randint(*CLUSTER_FAULTS)))
    kill_at = rng.choice(chosen) if chosen and rng.random() < OWNER_KILL_SHARE else None
    for index in chosen:
        kind = FaultKind.KILL_OWNER_BROKER if index == kill_at else rng.choice(moves)
        down_s = round(rng.uniform(0.0, 5.0 if kind is FaultKind.KILL_OWNER_BROKER else 0.8), 2)
        faults_list[index] = Fault(faults_list[index].at_s, kind, rng.randrange(1_000), down_s)
    return tuple(faults_list)


CLUSTER_KINDS = frozenset(
    {
        FaultKind.UNLOAD_TOPIC,
        FaultKind.MOVE_BUNDLE,
        FaultKind.SPLIT_BUNDLE,
        FaultKind.KILL_OWNER_BROKER,
        FaultKind.KILL_GENERATOR_DURING_MOVE,
        FaultKind.MOVE_WHILE_MARKER_WAITS,
    }
)
"""The faults only a cluster of several brokers has."""
HARD_FAULTS = frozenset({FaultKind.RESTART_BROKER, FaultKind.KILL_BROKER, FaultKind.CUT_GENERATOR})
"""The standalone's faults of the broker and the generator's link."""
