"""Whether a generator's event is about a topic's current incarnation, for the readers of companion topics.

The rule is watermark_core/incarnation.py (pure); this shell reads the topic property `wm.incarnation`
through the admin API when the rule asks: the first time a partition's event is judged (so after that
event was published: the generator sets the property before it publishes under a token) and when a
token not seen before arrives. Any role that may look a topic up may read its properties.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pulsar_access.admin import AdminError, PulsarAdmin, TopicNotFound
from pulsar_access.topics import partition_name
from watermark_core.incarnation import IncarnationCheck, Verdict
from watermark_core.protocol import INCARNATION_PROPERTY

log = logging.getLogger(__name__)


def incarnation_of(admin: PulsarAdmin, topic: str) -> str | None:
    """The property naming a (partition) topic's incarnation; None when it is not set or the topic does not exist."""
    try:
        return admin.topic_properties(topic).get(INCARNATION_PROPERTY)
    except TopicNotFound:
        return None


class Incarnations:
    """Per partition of the topics a reader follows, the `IncarnationCheck` and the property reads it asks for.

    Without an admin API at hand (`admin` None, or it does not answer or refuses the read), every event
    holds, as before incarnations existed, and that is said once with the fix. `on_change(topic, partition)`
    runs when a partition's incarnation changed while it was followed: what the reader kept of it goes.
    """

    def __init__(
        self, admin: PulsarAdmin | None, on_change: Callable[[str, int], None] | None = None, *, reader: str = ""
    ) -> None:
        self._admin = admin
        self._on_change = on_change
        self._reader = reader
        self._checks: dict[str, IncarnationCheck] = {}
        self._warned = False

    def holds(self, topic: str, partition: int, token: str | None) -> bool:
        """Whether an event about `topic`'s `partition` (-1: not partitioned) carrying `token` is about it as it is."""
        name = partition_name(topic, partition)
        check = self._checks.get(name)
        if check is None:
            check = self._checks[name] = self._first_check(name)
        verdict = check.judge(token)
        if verdict is Verdict.ASK and token is not None:
            try:
                current = incarnation_of(self._admin, name) if self._admin is not None else None
            except AdminError as exc:
                log.debug("reading the incarnation of %s failed (%s); skipping an event of it", name, exc)
                return False
            if check.learned(token, current) and self._on_change is not None:
                log.info("%s: a new incarnation (the topic was deleted and created again); forgetting the old one's "
                         "watermarks", name)  # fmt: skip
                self._on_change(topic, partition)
            verdict = check.judge(token)
        return verdict is Verdict.HOLDS

    def _first_check(self, name: str) -> IncarnationCheck:
        if self._admin is not None:
            try:
                return IncarnationCheck(incarnation_of(self._admin, name))
            except AdminError as exc:
                failure: object = exc
        else:
            failure = "no admin URL"
        if not self._warned:
            self._warned = True
            log.warning(
                "%scannot read the topic property %s of %s (%s): watermarks are taken without checking that they are "
                "about the topic as it is now, so after the topic is deleted and created again its old watermark "
                "may show until the generator publishes anew. Set PULSAR_ADMIN_URL (or admin_url=) to the "
                "cluster's admin API, reachable with the same credentials",
                f"{self._reader}: " if self._reader else "", INCARNATION_PROPERTY, name, failure,
            )  # fmt: skip
        return IncarnationCheck(None, known=False)
