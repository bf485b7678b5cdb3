"""The plugin's intake report as the engine's events (no broker)."""

from __future__ import annotations

import base64

import orjson
import pytest

from broker_ext.engine.partition import decode_raw
from broker_ext.engine.vocabulary import EntryRead, RawMarker
from broker_ext.intake.plugin_stream import intake_report
from watermark_core.protocol import MarkerKind, encode_idle, encode_set

pytestmark = pytest.mark.unit


def _marker(kind: str, payload: bytes, at: list[int], producer: str = "p1") -> dict[str, object]:
    return {"marker": kind, "at": at, "producer": producer, "payload": base64.b64encode(payload).decode(),
            "publishTime": 1_700_000_000_123, "txn": False}  # fmt: skip


def test_markers_and_the_data_between_become_entries_in_log_order() -> None:
    report = intake_report({
        "found": [
            {"data": [5, 3, -1], "producers": {"b": [1, 250], "a": [15, 200]}},
            _marker("W_SET", encode_set(1_000), [5, 4, 2]),
            {"data": [5, 4, 4], "producers": {"p1": [2, None]}},
            _marker("W_IDLE", encode_idle(), [5, 6, -1]),
        ],
        "scannedTo": [5, 7],
        "overflowed": False,
    })  # fmt: skip
    first, w_set, data, w_idle = report.entries
    assert first == EntryRead((5, 3, -1), stretch=(("a", 15, 200), ("b", 1, 250)))
    assert w_set == EntryRead((5, 4, 2), raw=RawMarker("W_SET", encode_set(1_000), "p1", (5, 4, 2), 1_700_000_000_123))
    assert w_set.raw is not None and decode_raw(w_set.raw).event_time == 1_000  # as the engine decodes it
    assert data == EntryRead((5, 4, 4), stretch=(("p1", 2, 0),))  # no event time: 0, as a consumer reads it
    assert w_idle.raw is not None and decode_raw(w_idle.raw).kind is MarkerKind.W_IDLE
    assert report.scanned_to == (5, 7) and not report.overflowed


def test_a_marker_that_does_not_decode_is_handed_as_it_came() -> None:
    """The engine decodes it (and follows it as data, telling the shell to count it): the shell only reads the form."""
    report = intake_report({"found": [_marker("W_SET", b"\xc1not msgpack", [5, 1, -1])], "scannedTo": [5, 1]})
    (entry,) = report.entries
    assert entry.raw is not None and entry.raw.payload == b"\xc1not msgpack" and entry.marker is None


def test_an_answer_of_another_shape_names_the_version() -> None:
    with pytest.raises(ValueError, match="not of this generator's version"):
        intake_report({"found": [{"data": [5, 1]}]})


def test_the_plugins_own_rendering_reads_back() -> None:
    """The string IntakeJsonTest.java asserts the plugin renders: the two sides agree on the form."""
    rendered = (
        '{"found":[{"data":[5,3,-1],"producers":{"a":[15,200],"b":[1,null]}},'
        '{"marker":"W_SET","at":[5,4,2],"producer":"p\\"1","payload":"gaE=",'
        '"publishTime":1700000000123,"txn":true}],"scannedTo":[5,6],"overflowed":false}'
    )
    report = intake_report(orjson.loads(rendered))
    assert report.entries[0] == EntryRead((5, 3, -1), stretch=(("a", 15, 200), ("b", 1, 0)))
    raw = report.entries[1].raw
    assert raw is not None and raw.position == (5, 4, 2) and raw.producer == 'p"1' and raw.payload == b"\x81\xa1"
    assert report.scanned_to == (5, 6)
