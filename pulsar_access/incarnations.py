"""Whether a generator's event is about a topic's current incarnation, for the readers of companion topics.

The rule is watermark_core/incarnation.py (pure); this shell reads the topic property `wm.incarnation`
through the admin API when the rule asks: the first time a partition's event is judged (so after that
event was published: the generator sets the property before it publishes under a token) and when a
token not seen before arrives. Any role that may look a topic up may read its properties.
`CompanionReader` (pulsar_access/companion.py) asks it about every event it hands on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace

from pulsar_access.admin import AdminError, PulsarAdmin, TopicNotFound
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import partition_name
from watermark_core.incarnation import IncarnationCheck, Verdict
from watermark_core.protocol import INCARNATION_PROPERTY

log = logging.getLogger(__name__)

CONSUMER_ADMIN_TIMEOUT_S = 5.0


def incarnation_of(admin: PulsarAdmin, topic: str) -> str | None:
    """The property naming a (partition) topic's incarnation; None when it is not set or the topic does not exist."""
    try:
        return admin.topic_properties(topic).get(INCARNATION_PROPERTY)
    except TopicNotFound:
        return None


class Incarnations:
    """Per partition of the topics a reader follows, the `IncarnationCheck` and the property reads it asks for.

    Without an admin API at hand (`admin` None, or it does not answer or refuses the read), every event
    holds, as before incarnations existed. `named`: the user named this admin API (or the reader needs it
    anyway); then a failed read is a warning, once, with the fix. Otherwise (a consumer left on the default
    URL) it is said at debug level, and a warning comes only if a partition's events change their token
    while it cannot be checked: the topic was re-created, the one case the check is for (docs/DECISIONS.md,
    "A re-created topic"). `on_change(topic, partition)` runs when a partition's incarnation changed while
    it was followed: what the reader kept of it goes.
    """

    def __init__(
        self, admin: PulsarAdmin | None, on_change: Callable[[str, int], None] | None = None, *, reader: str = "",
        named: bool = True, owns_admin: bool = False,
    ) -> None:  # fmt: skip
        self._admin = admin
        self._on_change = on_change
        self._reader = reader
        self._named = named
        self._owns_admin = owns_admin
        self._checks: dict[str, IncarnationCheck] = {}
        self._unchecked_tokens: dict[str, str] = {}
        """Per partition that cannot be checked, the first token seen: another one means a re-created topic."""
        self._failure: object = None
        """Why the property could not be read (the first time)."""
        self._warned = False

    @classmethod
    def for_consumer(cls, admin_url: str | None, *, reader: str) -> Incarnations:
        """A consumer's: the admin API at `admin_url`, else `PULSAR_ADMIN_URL`, else the default (not named)."""
        settings = PulsarSettings.from_env()
        named = admin_url is not None or "PULSAR_ADMIN_URL" in os.environ
        admin = PulsarAdmin(replace(settings, admin_url=(admin_url or settings.admin_url).rstrip("/")),
                            CONSUMER_ADMIN_TIMEOUT_S)  # fmt: skip
        return cls(admin, reader=reader, named=named, owns_admin=True)

    def holds(self, topic: str, partition: int, token: str | None) -> bool:
        """Whether an event about `topic`'s `partition` (-1: not partitioned) carrying `token` is about it as it is."""
        name = partition_name(topic, partition)
        check = self._checks.get(name)
        if check is None:
            check = self._checks[name] = self._first_check(name)
        if not check.known:
            self._note_unchecked(name, token)
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
        if self._admin is not None and self._failure is None:
            try:
                return IncarnationCheck(self._admin.topic_properties(name).get(INCARNATION_PROPERTY))
            except TopicNotFound:
                # The reader follows it, so it exists: this admin API is another cluster's (a consumer left on
                # the default URL while something else listens there). Its "no property" would make every
                # event with a token stale, so the topic goes unchecked instead.
                self._failure = f"the admin API at {self._admin.base_url} does not know the topic"
            except AdminError as exc:
                self._failure = exc  # not asked again for the other partitions: each would wait as long
        self._failure = self._failure or "no admin URL"
        if self._named:
            self._warn(name)
        else:
            log.debug("%scannot read the topic property %s of %s (%s): taking its watermarks unchecked",
                      self._prefix, INCARNATION_PROPERTY, name, self._failure)  # fmt: skip
        return IncarnationCheck(None, known=False)

    def _note_unchecked(self, name: str, token: str | None) -> None:
        if token is not None and self._unchecked_tokens.setdefault(name, token) != token:
            self._warn(name, f"its watermarks changed incarnation ({self._unchecked_tokens[name]} to {token})")

    def _warn(self, name: str, why: str = "") -> None:
        if self._warned:
            return
        self._warned = True
        log.warning(
            "%scannot read the topic property %s of %s (%s)%s: watermarks are taken without checking that they are "
            "about the topic as it is now, so after the topic is deleted and created again its old watermark may "
            "show until the generator publishes anew. Set PULSAR_ADMIN_URL (or admin_url=) to the cluster's admin "
            "API, reachable with the same credentials",
            self._prefix, INCARNATION_PROPERTY, name, self._failure, f", and {why}" if why else "",
        )  # fmt: skip

    @property
    def _prefix(self) -> str:
        return f"{self._reader}: " if self._reader else ""

    def close(self) -> None:
        """Close the admin API's connections if this made it (`for_consumer`)."""
        if self._owns_admin and self._admin is not None:
            self._admin.close()
