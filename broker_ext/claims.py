"""Which generator owns a topic, by claim (`--ownership claim`): the holder of its companion topic's producer.

Each instance asks for the producer of every followed topic's companion topic (where its tables go) in
Pulsar's `WaitForExclusive` access mode. Pulsar grants it to one instance and queues the others' requests:
that instance owns every partition of every topic whose tables go there, and no other producer can write
those tables, so a stale owner's sends fail (`ProducerFenced`) instead of landing. A claim is the companion
topic's, not a data topic's: a companion topic may carry the tables of several topics (issue 47), and they
are owned together. When the holder's connection closes (a
`kill -9` closes it at once; a lost host after Pulsar's keep-alive) the broker grants the next request in the
queue within milliseconds. A holder whose producer went back to Pulsar's queue (the companion topic moved to
another broker and another instance reconnected first) sees it disconnected at the next check: it gives the
topic up and asks again, behind the new holder.

Who asks first: every instance holds a producer named after it on the members topic (`__wm_generators` in the
watermark namespace) and reads that topic's producers every `MEMBERS_EVERY_S`. The instances ranked for a claim
by a hash of the companion topic and their names (rendezvous hashing), the first asks at once and the k-th `k *
HOLD_OFF_S` later, so the topics spread evenly over instances that start together, and the next in rank is the
standby (its request is next in Pulsar's queue). With several brokers, an instance asks at once for the topics
of its own broker (the first of its admin URLs), so with one generator per broker each tends to own its broker's
topics. Each member's producer carries what it follows (its properties), so an instance ranks only among those
that follow a topic of the claim's group. The holder follows every topic of its groups that another member
follows (`adoptions`), as nobody else can publish them meanwhile: generators that follow different topics of one
namespace do not starve each other's topics of a group. An owner that is not first in rank hands the topic over
(releases its claim and asks again after its hold-off) once the first has been a member for `REBALANCE_AFTER_S`,
so an instance that joins later gets its share.

Runs on the event loop's thread; the client's answers are posted to it. No consumer and no timer per topic:
one check of every held producer every `CHECK_S`, and a request waiting in Pulsar's queue costs nothing
until it is granted (the claims' client waits up to `WAIT_S` before asking again).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import _pulsar
import pulsar

from broker_ext.dispatch import BATCH_DELAY_MS
from broker_ext.loop import EventLoop
from broker_ext.ownership import CLAIM_PRODUCER_PREFIX
from pulsar_access.admin import AdminError, PulsarAdmin
from pulsar_access.topics import TopicName, watermark_namespace, watermark_topic_for

log = logging.getLogger(__name__)

CHECK_S = 2.0
"""How often every held producer is checked to be still connected (a claim lost without a send)."""
RETRY_S = 1.0
"""After a request failed (the broker away, the namespace missing): ask again this much later."""
WAIT_S = 3_600
"""How long one request waits in Pulsar's queue (the claims' client's operation timeout) before it is made
again: a standby re-asks each topic about once an hour, not every few seconds."""
HOLD_OFF_S = 1.0
"""The k-th instance in a topic's rank asks for its claim this much times k later than the first."""
STARVED_S = 30.0
"""A request unanswered this long, with no member following a topic of the claim's group, is warned about (`_ask`)."""
MEMBERS_TOPIC = "__wm_generators"
MEMBER_PREFIX = "__wm_member-"
MEMBERS_EVERY_S = 5.0
STARTUP_S = 2.0
"""Nothing is claimed in an instance's first seconds: instances started together see each other first."""
REBALANCE_AFTER_S = 15.0
"""An owner hands a topic over to the instance first in rank once that one has been a member this long, and the
claim has been held this long (no handing back and forth while instances start)."""


@dataclass(frozen=True)
class Follows:
    """What a generator instance follows: namespaces (`tenant/ns`) and base topics (full names)."""

    namespaces: frozenset[str] = frozenset()
    topics: frozenset[str] = frozenset()

    def __contains__(self, base_topic: str) -> bool:
        namespace = "/".join(base_topic.split("://", 1)[-1].split("/")[:2])
        return namespace in self.namespaces or base_topic in self.topics

    def properties(self) -> dict[str, str]:
        return {"namespaces": ",".join(sorted(self.namespaces)), "topics": ",".join(sorted(self.topics))}

    @classmethod
    def of(cls, properties: dict[str, str]) -> Follows:
        def split(value: str) -> frozenset[str]:
            return frozenset(part for part in value.split(",") if part)

        return cls(split(properties.get("namespaces", "")), split(properties.get("topics", "")))


@functools.lru_cache(maxsize=1 << 16)
def companion_of(base_topic: str, namespace: str | None) -> str:
    """`watermark_topic_for`, cached: discovery asks it of every topic of an adopted namespace at every look."""
    return watermark_topic_for(base_topic, namespace)


def shares(follows: Follows, claim: Claim, namespace: str | None) -> bool:
    """Whether a generator following `follows` follows a topic of the claim's group (any of it, not only ours)."""
    one = next(iter(claim.topics), None)  # a group is one namespace's: one of its topics tells a namespace followed
    return (one is not None and one in follows) or any(
        companion_of(topic, namespace) == claim.companion for topic in follows.topics
    )


def rank(companion: str, instance_id: str, members: set[str]) -> int:
    """Where `instance_id` stands among `members` for `companion`'s claim (0: asks first), by rendezvous hashing."""
    return ranked(companion, members | {instance_id}).index(instance_id)


def ranked(companion: str, members: set[str]) -> list[str]:
    """`members` in the order they ask for `companion`'s claim."""

    def weight(member: str) -> bytes:
        return hashlib.blake2b(f"{companion}\x00{member}".encode(), digest_size=8).digest()

    return sorted(members, key=weight)


@dataclass
class Claim:
    """One companion topic's claim: the followed base topics whose tables go there, its producer once granted, and
    the request in flight."""

    companion: str
    topics: set[str] = field(default_factory=set)
    producer: pulsar.Producer | None = None
    """The granted producer (the dispatcher sends the topics' tables on it)."""
    asking: int = 0
    """The request in flight (a counter: an answer to an earlier one is stale), 0: none."""
    home: bool = False
    """Its topics are served by this instance's own broker (of several): it keeps them whatever the rank."""
    held_since: float = 0.0
    warned: bool = False
    """Whether `Claims._still_waiting` said why it waits (once)."""


class Claims:
    """The claims of one generator instance, over every followed topic."""

    def __init__(
        self, client: pulsar.Client, loop: EventLoop, instance_id: str, namespace: str | None,
        gained: Callable[[str, frozenset[str], pulsar.Producer], None], lost: Callable[[str, frozenset[str]], None],
        admin: PulsarAdmin | None = None, pool: Executor | None = None, members_client: pulsar.Client | None = None,
        follows: Follows = Follows(),
    ) -> None:  # fmt: skip
        self._client = client
        self._loop = loop
        self._instance_id = instance_id
        self._namespace = namespace
        self._gained = gained
        """Called with the companion topic, its base topics and the producer when Pulsar grants a claim, and with a
        topic that joins a held claim (loop thread)."""
        self._lost = lost
        """Called with the companion topic and its base topics when a held claim is lost or dropped (loop thread)."""
        self._claims: dict[str, Claim] = {}
        """By companion topic."""
        self._of_topic: dict[str, Claim] = {}
        """The claim of each followed base topic."""
        self._requests = 0
        self._checking = False
        self._admin = admin
        self._pool = pool
        self._members_client = members_client or client
        """Holds this instance's member producer (a client with a short operation timeout: the pool's thread waits)."""
        self._follows = follows
        self._members: dict[str, Follows] = {}
        """The other instances with a producer on the members topic and what each follows, as read last (set on the
        loop thread, replaced whole: discovery's thread reads it)."""
        self._held: dict[str, str] = {}
        """The companion topics whose claims are held, with their topics' namespace (`tenant/ns`); replaced whole on
        the loop thread, read by discovery's (`adoptions`)."""
        self._joined: dict[str, float] = {}
        """When each member was first seen."""
        self._member: pulsar.Producer | None = None
        self._ready_at = time.time() + STARTUP_S
        self._members_topic = f"persistent://{watermark_namespace(namespace)}/{MEMBERS_TOPIC}"

    def start(self) -> None:
        """Join the members (on the pool) and read them now and then."""
        if self._pool is not None and self._admin is not None:
            self._pool.submit(self._read_members)

    def _read_members(self) -> None:
        """On the pool: join the members (once it succeeds), read who they are now, then again in `MEMBERS_EVERY_S`."""
        assert self._admin is not None and self._pool is not None
        if self._member is None:
            name = f"{MEMBER_PREFIX}{self._instance_id}"
            try:
                self._member = self._members_client.create_producer(self._members_topic, producer_name=name,
                                                                    properties=self._follows.properties())  # fmt: skip
            except Exception as exc:  # ranked as if alone meanwhile: it asks for every topic at once
                log.warning("joining the generators on %s failed (%s); trying again in %.0f s",
                            self._members_topic, exc, MEMBERS_EVERY_S)  # fmt: skip
        try:
            publishers = self._admin.topic_stats(self._members_topic).get("publishers") or []
        except AdminError as exc:
            log.debug("reading the generators on %s failed: %s", self._members_topic, exc)
        else:
            members = {
                str(p["producerName"]).removeprefix(MEMBER_PREFIX): Follows.of(dict(p.get("metadata") or {}))
                for p in publishers if str(p.get("producerName", "")).startswith(MEMBER_PREFIX)
            }  # fmt: skip
            members.pop(self._instance_id, None)
            self._loop.post(lambda: self._members_read(members))
        self._loop.post(lambda: self._loop.call_at(time.time() + MEMBERS_EVERY_S, ("claims", "members"),
                                                   self._read_members_later))  # fmt: skip

    def _read_members_later(self) -> None:
        if self._pool is not None:
            self._pool.submit(self._read_members)

    def _members_read(self, members: dict[str, Follows]) -> None:
        if members.keys() != self._members.keys():
            log.info("generators: %s", ", ".join(sorted({*members, self._instance_id})))
        now = time.time()
        self._joined = {m: self._joined.get(m, now) for m in members}
        self._members = members
        self._hand_over_where_not_first(now)

    def _rank(self, claim: Claim) -> list[str]:
        """The instances following a topic of the claim's group (this one too), in the order they ask for it."""
        following = {m for m, f in self._members.items() if shares(f, claim, self._namespace)}
        return ranked(claim.companion, following | {self._instance_id})

    def adoptions(self) -> Follows:
        """What this instance follows for other members (on discovery's thread): of each group whose claim it holds,
        the topics another member names and the namespaces another member follows (`adopts` says which of their
        topics are of a held group)."""
        held, members = self._held, self._members
        if not held:
            return Follows()
        namespaces = set(held.values())
        return Follows(
            frozenset(n for f in members.values() for n in f.namespaces if n in namespaces) - self._follows.namespaces,
            frozenset(t for f in members.values() for t in f.topics
                      if companion_of(t, self._namespace) in held and t not in self._follows),
        )  # fmt: skip

    def adopts(self, base_topic: str) -> bool:
        """Whether this instance follows the topic for other members: its group's claim is held here, we do not
        follow it ourselves, and a member does (any thread)."""
        return (
            companion_of(base_topic, self._namespace) in self._held
            and base_topic not in self._follows
            and any(base_topic in f for f in self._members.values())
        )

    def _holding_changed(self) -> None:
        self._held = {
            c.companion: TopicName.parse(next(iter(c.topics))).tenant_namespace
            for c in self._claims.values() if c.producer is not None and c.topics
        }  # fmt: skip

    def _hand_over_where_not_first(self, now: float) -> None:
        """Release the held claims whose first in rank is another instance, a member long enough to follow the
        topic (it asked at once): Pulsar grants it the claim; we ask again after our hold-off, as its standby."""
        for claim in list(self._claims.values()):
            if claim.producer is None or claim.home or now - claim.held_since < REBALANCE_AFTER_S:
                continue
            order = self._rank(claim)
            first = order[0]
            if first == self._instance_id or now - self._joined.get(first, now) < REBALANCE_AFTER_S:
                continue
            log.info("%s: handing its topics over to generator %s (first in rank)", claim.companion, first)
            self._release(claim)
            later = now + order.index(self._instance_id) * HOLD_OFF_S
            self._loop.call_at(later, ("claim", claim.companion), functools.partial(self._ask, claim))

    def held(self, base_topic: str) -> pulsar.Producer | None:
        """The granted producer of the topic's companion, or None."""
        claim = self._of_topic.get(base_topic)
        return None if claim is None else claim.producer

    def want(self, base_topic: str, *, home: bool = False) -> None:
        """Claim a followed topic's companion (once; again after a loss): at once where `home` (served by this
        instance's own broker, of several), else after its rank's hold-off (and never in the instance's first
        `STARTUP_S`). A topic whose companion is claimed already joins that claim (and is owned at once if held)."""
        if base_topic in self._of_topic:
            return
        companion = watermark_topic_for(base_topic, self._namespace)
        claim = self._claims.get(companion)
        fresh = claim is None
        if claim is None:
            claim = self._claims[companion] = Claim(companion)
        self._of_topic[base_topic] = claim
        claim.home = home if fresh else claim.home and home  # kept whatever the rank only if all are served here
        claim.topics.add(base_topic)
        if fresh:
            self._schedule(claim, home)
        elif claim.producer is not None:
            self._gained(companion, frozenset({base_topic}), claim.producer)

    def _schedule(self, claim: Claim, home: bool) -> None:
        if time.time() < self._ready_at:
            self._loop.call_at(self._ready_at, ("claim", claim.companion), lambda: self._after_rank(claim, home))
        else:
            self._after_rank(claim, home)
        if not self._checking:
            self._checking = True
            self._loop.call_at(time.time() + CHECK_S, ("claims", "check"), self._check)

    def _after_rank(self, claim: Claim, home: bool) -> None:
        place = 0 if home else self._rank(claim).index(self._instance_id)
        if place == 0:
            self._ask(claim)
        else:
            self._loop.call_at(time.time() + place * HOLD_OFF_S, ("claim", claim.companion), lambda: self._ask(claim))

    def drop(self, base_topic: str) -> None:
        """The topic is gone: it leaves its claim; the last to leave gives the claim up (a held producer is closed;
        a request's answer is ignored)."""
        claim = self._of_topic.pop(base_topic, None)
        if claim is None:
            return
        claim.topics.discard(base_topic)
        if claim.topics:
            return
        del self._claims[claim.companion]
        self._loop.cancel(("claim", claim.companion))
        if claim.producer is not None:
            self._release(claim)

    def fenced(self, companion: str) -> None:
        """A send on the companion's producer was refused as fenced: another instance holds the claim now."""
        claim = self._claims.get(companion)
        if claim is not None and claim.producer is not None:
            log.info("%s: Pulsar fenced our producer: another generator owns its topics now", companion)
            self._give_up(claim)

    def close(self) -> None:
        claims, self._claims = list(self._claims.values()), {}
        if self._member is not None:
            with contextlib.suppress(Exception):
                self._member.close()
        for claim in claims:
            if claim.producer is not None:
                with contextlib.suppress(Exception):
                    claim.producer.close()
        with contextlib.suppress(Exception):
            self._client.close()

    # -- requests --------------------------------------------------------------------------------------

    def _ask(self, claim: Claim) -> None:
        if self._claims.get(claim.companion) is not claim or claim.producer is not None or claim.asking:
            return
        self._requests += 1
        claim.asking = attempt = self._requests
        conf = _pulsar.ProducerConfiguration()
        conf.batching_enabled(True)  # a group's tables sent together go as one entry
        conf.batching_max_publish_delay_ms(BATCH_DELAY_MS)
        conf.producer_name(f"{CLAIM_PRODUCER_PREFIX}{self._instance_id}-{attempt}")
        conf.access_mode(pulsar.ProducerAccessMode.WaitForExclusive)
        post = self._loop.post

        def answered(result: pulsar.Result, producer: Any) -> None:  # on a client thread
            post(lambda: self._answered(claim, attempt, result, producer))

        try:
            self._client._client.create_producer_async(claim.companion, conf, answered)
        except Exception as exc:  # the client closed, the namespace check failed: asked again later
            failure = exc
            self._loop.post(lambda: self._answered(claim, attempt, failure, None))
        self._loop.call_at(time.time() + STARVED_S, ("claim-wait", claim.companion),
                           lambda: self._still_waiting(claim, attempt))  # fmt: skip

    def _still_waiting(self, claim: Claim, attempt: int) -> None:
        """Say once why a claim that no member could hold is not granted: a generator that is not a member holds it
        (its member producer failed, an older version), and it may publish none of our topics."""
        if claim.asking != attempt or claim.warned or self._claims.get(claim.companion) is not claim:
            return
        if self._rank(claim) != [self._instance_id]:
            return  # a standby: the member holding the claim publishes our topics too (`adoptions`)
        claim.warned = True
        log.warning(
            "%s: waiting %.0f s for its claim, and no generator following a topic of its group is a member (on %s): "
            "one that is not a member holds it and may not publish %s. Look for a generator, publishing in this "
            "watermark namespace, whose log says that joining the generators failed, or of an older version",
            claim.companion, STARVED_S, self._members_topic, _named(claim.topics),
        )  # fmt: skip

    def _answered(self, claim: Claim, attempt: int, result: object, producer: Any) -> None:
        if claim.asking != attempt:
            return
        claim.asking = 0
        current = self._claims.get(claim.companion) is claim
        if result != pulsar.Result.Ok:
            if current:
                if result != pulsar.Result.Timeout:  # a timeout: it waited `WAIT_S` in the queue; ask again now
                    log.debug("claiming %s failed (%s); asking again in %.0f s", claim.companion, result, RETRY_S)
                delay = 0.0 if result == pulsar.Result.Timeout else RETRY_S
                self._loop.call_at(time.time() + delay, ("claim", claim.companion), lambda: self._ask(claim))
            return
        if not current:  # dropped meanwhile
            with contextlib.suppress(Exception):
                producer.close_async(lambda _result: None)
            return
        claim.held_since = time.time()
        claim.producer = wrapped = pulsar.Producer()  # as `pulsar.Client.create_producer` wraps the binding's
        wrapped._producer, wrapped._schema = producer, pulsar.schema.BytesSchema()
        wrapped._client = self._client._client
        self._holding_changed()
        log.info("%s: claimed (this generator holds its producer): owning %s", claim.companion,
                 _named(claim.topics))  # fmt: skip
        self._gained(claim.companion, frozenset(claim.topics), wrapped)

    # -- held claims -------------------------------------------------------------------------------------

    def _check(self) -> None:
        """Every held producer still connected? One that is not has lost its claim (or is reconnecting: either
        way it is given up and asked for again; Pulsar grants it back at once if nobody else waits)."""
        for claim in list(self._claims.values()):
            if claim.producer is not None and not claim.producer.is_connected():
                log.info("%s: our producer is disconnected: giving %s up and claiming again", claim.companion,
                         _named(claim.topics))  # fmt: skip
                self._give_up(claim)
        if self._claims:
            self._loop.call_at(time.time() + CHECK_S, ("claims", "check"), self._check)
        else:
            self._checking = False

    def _give_up(self, claim: Claim) -> None:
        self._release(claim)
        self._ask(claim)

    def _release(self, claim: Claim) -> None:
        producer, claim.producer = claim.producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                producer._producer.close_async(lambda _result: None)
        self._holding_changed()
        self._lost(claim.companion, frozenset(claim.topics))


def _named(topics: set[str]) -> str:
    """The topics of a claim, for the log: the one, or how many."""
    return next(iter(topics)) if len(topics) == 1 else f"{len(topics)} topics"
