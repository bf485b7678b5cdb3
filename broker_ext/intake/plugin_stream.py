"""What the broker plugin's intake hands over, as the engine's events.

The plugin reads each followed topic behind the writer and reports, in log order, the markers it found and the
data between them summed per producer (its `TopicIntake`); this turns one topic's report into `EntryRead`s, the
events a consumer's delivery would have given (markers raw: the engine decodes them). Pure: no I/O. The form
(docs/PROTOCOL.md section 10, "The intake"):

    {"found": [{"data": [ledger, entry, last batch index], "producers": {name: [messages, lowest or null]}},
               {"marker": kind, "at": [ledger, entry, batch index], "producer": name, "payload": base64,
                "publishTime": ms, "txn": bool}, ...],
     "scannedTo": [ledger, entry], "overflowed": bool}
"""

from __future__ import annotations

from binascii import a2b_base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker_ext.engine.vocabulary import EntryRead, RawMarker
from watermark_core.protocol import position_of


@dataclass(frozen=True)
class IntakeReport:
    """One topic's findings since the generator's last answer."""

    entries: tuple[EntryRead, ...]
    scanned_to: tuple[int, int]
    """Every entry up to here was read (with or without something found)."""
    overflowed: bool
    """The plugin keeps nothing more for this topic: the generator is too far behind and reads the log itself."""


def intake_report(report: Mapping[str, Any]) -> IntakeReport:
    """The `intake` of one topic in the plugin's answer as events; `ValueError` for an answer of another shape."""
    entries: list[EntryRead] = []
    try:
        for found in report.get("found") or ():
            if "marker" in found:
                ledger, entry, batch = found["at"]
                position = position_of(ledger, entry, batch)
                payload = a2b_base64(found["payload"])  # what `base64.b64decode` does, without its layers
                raw = RawMarker(str(found["marker"]), payload, str(found["producer"]), position,
                                int(found["publishTime"]))  # fmt: skip
                entries.append(EntryRead(position, None, "", 0, (), raw))
            else:
                ledger, entry, batch = found["data"]
                stretch = tuple(
                    (str(producer), int(messages), int(lowest or 0))
                    for producer, (messages, lowest) in sorted(found["producers"].items())
                )  # fmt: skip
                entries.append(EntryRead(position_of(ledger, entry, batch), stretch=stretch))
        scanned = report.get("scannedTo") or (-1, -1)
        return IntakeReport(tuple(entries), (int(scanned[0]), int(scanned[1])), bool(report.get("overflowed")))
    except (KeyError, TypeError, ValueError) as exc:  # binascii.Error is a ValueError
        raise ValueError(f"the plugin's intake report is not of this generator's version ({exc!r})") from exc
