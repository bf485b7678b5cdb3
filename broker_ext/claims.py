"""Which generator owns a topic, by claim (`--ownership claim`): the holder of its companion topic's producer.

Each instance asks for the producer of every followed topic's companion topic (where its tables go) in
Pulsar's `WaitForExclusive` access mode. Pulsar grants it to one instance and queues the others' requests:
that instance owns every partition of the topic, and no other producer can write the topic's tables, so a
stale owner's sends fail (`ProducerFenced`) instead of landing. When the holder's connection closes (a
`kill -9` closes it at once; a lost host after Pulsar's keep-alive) the broker grants the next request in the
queue within milliseconds. A holder whose producer went back to Pulsar's queue (the companion topic moved to
another broker and another instance reconnected first) sees it disconnected at the next check: it gives the
topic up and asks again, behind the new holder.

Runs on the event loop's thread; the client's answers are posted to it. No consumer and no timer per topic:
one check of every held producer every `CHECK_S`, and a request waiting in Pulsar's queue costs nothing
until it is granted (the claims' client waits up to `WAIT_S` before asking again).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import _pulsar
import pulsar

from broker_ext.loop import EventLoop
from pulsar_access.topics import watermark_topic_for

log = logging.getLogger(__name__)

CHECK_S = 2.0
"""How often every held producer is checked to be still connected (a claim lost without a send)."""
RETRY_S = 1.0
"""After a request failed (the broker away, the namespace missing): ask again this much later."""
WAIT_S = 3_600
"""How long one request waits in Pulsar's queue (the claims' client's operation timeout) before it is made
again: a standby re-asks each topic about once an hour, not every few seconds."""
HOLD_OFF_S = 1.0
"""A topic that the instance's first broker does not serve is claimed this much later, so that with one
generator per broker (pointed at its own broker first) each tends to own the topics of its broker."""


@dataclass
class Claim:
    """One base topic's claim: its companion producer once granted, and the request in flight."""

    base_topic: str
    companion: str
    producer: pulsar.Producer | None = None
    """The granted producer (the dispatcher sends the topic's tables on it)."""
    asking: int = 0
    """The request in flight (a counter: an answer to an earlier one is stale), 0: none."""


class Claims:
    """The claims of one generator instance, over every followed topic."""

    def __init__(
        self, client: pulsar.Client, loop: EventLoop, instance_id: str, namespace: str | None,
        gained: Callable[[str, pulsar.Producer], None], lost: Callable[[str], None],
    ) -> None:  # fmt: skip
        self._client = client
        self._loop = loop
        self._instance_id = instance_id
        self._namespace = namespace
        self._gained = gained
        """Called with the base topic and its producer when Pulsar grants a claim (loop thread)."""
        self._lost = lost
        """Called with the base topic when a held claim is lost or dropped (loop thread)."""
        self._claims: dict[str, Claim] = {}
        self._requests = 0
        self._checking = False

    def held(self, base_topic: str) -> pulsar.Producer | None:
        """The topic's granted companion producer, or None."""
        claim = self._claims.get(base_topic)
        return None if claim is None else claim.producer

    def want(self, base_topic: str, *, hold_off: bool = False) -> None:
        """Claim a followed topic (once; again after a loss): at once, or after `HOLD_OFF_S`."""
        if base_topic in self._claims:
            return
        claim = self._claims[base_topic] = Claim(base_topic, watermark_topic_for(base_topic, self._namespace))
        if hold_off:
            self._loop.call_at(time.time() + HOLD_OFF_S, ("claim", base_topic), lambda: self._ask(claim))
        else:
            self._ask(claim)
        if not self._checking:
            self._checking = True
            self._loop.call_at(time.time() + CHECK_S, ("claims", "check"), self._check)

    def drop(self, base_topic: str) -> None:
        """The topic is gone: give its claim up (a held producer is closed; a request's answer is ignored)."""
        claim = self._claims.pop(base_topic, None)
        self._loop.cancel(("claim", base_topic))
        if claim is not None and claim.producer is not None:
            self._release(claim)

    def fenced(self, base_topic: str) -> None:
        """A send on the topic's producer was refused as fenced: another instance holds the claim now."""
        claim = self._claims.get(base_topic)
        if claim is not None and claim.producer is not None:
            log.info("%s: Pulsar fenced our producer on %s: another generator owns the topic now",
                     base_topic, claim.companion)  # fmt: skip
            self._give_up(claim)

    def close(self) -> None:
        claims, self._claims = list(self._claims.values()), {}
        for claim in claims:
            if claim.producer is not None:
                with contextlib.suppress(Exception):
                    claim.producer.close()
        with contextlib.suppress(Exception):
            self._client.close()

    # -- requests --------------------------------------------------------------------------------------

    def _ask(self, claim: Claim) -> None:
        if self._claims.get(claim.base_topic) is not claim or claim.producer is not None or claim.asking:
            return
        self._requests += 1
        claim.asking = attempt = self._requests
        conf = _pulsar.ProducerConfiguration()
        conf.batching_enabled(False)
        conf.producer_name(f"__wm_dispatch-{self._instance_id}-{attempt}")
        conf.access_mode(pulsar.ProducerAccessMode.WaitForExclusive)
        post = self._loop.post

        def answered(result: pulsar.Result, producer: Any) -> None:  # on a client thread
            post(lambda: self._answered(claim, attempt, result, producer))

        try:
            self._client._client.create_producer_async(claim.companion, conf, answered)
        except Exception as exc:  # the client closed, the namespace check failed: asked again later
            failure = exc
            self._loop.post(lambda: self._answered(claim, attempt, failure, None))

    def _answered(self, claim: Claim, attempt: int, result: object, producer: Any) -> None:
        if claim.asking != attempt:
            return
        claim.asking = 0
        current = self._claims.get(claim.base_topic) is claim
        if result != pulsar.Result.Ok:
            if current:
                if result != pulsar.Result.Timeout:  # a timeout: it waited `WAIT_S` in the queue; ask again now
                    log.debug("%s: claiming %s failed (%s); asking again in %.0f s",
                              claim.base_topic, claim.companion, result, RETRY_S)  # fmt: skip
                delay = 0.0 if result == pulsar.Result.Timeout else RETRY_S
                self._loop.call_at(time.time() + delay, ("claim", claim.base_topic), lambda: self._ask(claim))
            return
        if not current:  # dropped meanwhile
            with contextlib.suppress(Exception):
                producer.close_async(lambda _result: None)
            return
        claim.producer = wrapped = pulsar.Producer()  # as `pulsar.Client.create_producer` wraps the binding's
        wrapped._producer, wrapped._schema = producer, pulsar.schema.BytesSchema()
        wrapped._client = self._client._client
        log.info("%s: claimed (this generator holds %s): owning the topic", claim.base_topic, claim.companion)
        self._gained(claim.base_topic, wrapped)

    # -- held claims -------------------------------------------------------------------------------------

    def _check(self) -> None:
        """Every held producer still connected? One that is not has lost its claim (or is reconnecting: either
        way it is given up and asked for again; Pulsar grants it back at once if nobody else waits)."""
        for claim in list(self._claims.values()):
            if claim.producer is not None and not claim.producer.is_connected():
                log.info("%s: our producer on %s is disconnected: giving the topic up and claiming it again",
                         claim.base_topic, claim.companion)  # fmt: skip
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
        self._lost(claim.base_topic)
