"""Which incarnation of a topic a generator's event is about (docs/DECISIONS.md, "A re-created topic").

A topic deleted and created again under its name is a new log (contract section 1), but its companion
topic stays, and positions cannot tell two incarnations apart: the new topic's ledger ids are higher,
as a live topic's are after a rollover. So the generator names each incarnation with a random token:
kept in its snapshots, written as the topic property `wm.incarnation` (deleted with the topic) before
any event carrying it is published, and stamped on every table, head event and W_SNAPSHOT. An event
holds for a reader only when its token is the topic's property; with no property, only events without
a token hold (a generator that may not set properties, or one of before this rule).

Pure: the reader reads the property (admin API) when `IncarnationCheck` asks it to.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from enum import Enum

STALE_TOKENS_KEPT = 64
"""Tokens found not to be the topic's that a check remembers (each costs one property read)."""


def new_token() -> str:
    """A fresh incarnation token: 64 random bits, so two incarnations never share one."""
    return secrets.token_hex(8)


class Verdict(Enum):
    HOLDS = "holds"
    """The event is about the topic's incarnation."""
    STALE = "stale"
    """The event is about another incarnation (a deleted one, or an unclaimed one): ignore it."""
    ASK = "ask"
    """A token not seen before: read the property again (`learned`), then judge again."""


@dataclass
class IncarnationCheck:
    """One partition's incarnation as a reader knows it: the property read last and the tokens found stale.

    `known` False: the property could not be read (no admin API at hand): every event holds, as before
    this rule, and a re-created topic's old watermark may show until the generator publishes anew.
    """

    current: str | None
    known: bool = True
    stale: dict[str, None] = field(default_factory=dict)

    def judge(self, token: str | None) -> Verdict:
        if not self.known or token == self.current:
            return Verdict.HOLDS
        if token is None or token in self.stale:
            return Verdict.STALE
        return Verdict.ASK

    def learned(self, asked: str, current: str | None) -> bool:
        """The property read again after `ASK` about token `asked`; whether the incarnation changed (then what was
        held of the old one is dropped by the caller). A token that is not the property now never will be: the
        generator writes the property before it publishes anything carrying the token."""
        changed = current != self.current
        if changed and self.current is not None:
            self._forget(self.current)
        if asked != current:
            self._forget(asked)
        self.current = current
        return changed

    def _forget(self, token: str) -> None:
        self.stale[token] = None
        while len(self.stale) > STALE_TOKENS_KEPT:
            del self.stale[next(iter(self.stale))]
