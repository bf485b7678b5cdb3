"""The blocking reads a rebuild asks for (`ReadRange`, `ReadMarkerAt`), run on a worker thread.

Each opens a reader of its own on the partition; the answers go back to the engine as events.
"""

from __future__ import annotations

import contextlib
import logging
import time

import pulsar

from broker_ext.engine.recovery import BEFORE_EVERYTHING
from broker_ext.engine.vocabulary import MarkerFetched, RangeRead, RawMarker, ReadMarkerAt, ReadRange
from pulsar_access.admin import PulsarAdmin
from pulsar_access.readers import NotAnswered, has_message_available
from watermark_core.protocol import MARKER_PROPERTY, Position, position_of

log = logging.getLogger(__name__)

FOLD_READ_LIMIT_S = 60.0
"""How long a range read may keep waiting for entries the broker says exist."""


def message_position(message: pulsar.Message) -> Position:
    msg_id = message.message_id()
    return position_of(msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index())


def raw_marker(message: pulsar.Message, position: Position) -> RawMarker | None:
    """The marker in a message as Pulsar holds it (the engine decodes it); None for data."""
    kind = message.properties().get(MARKER_PROPERTY)
    if kind is None:
        return None
    return RawMarker(kind, message.data(), message.producer_name(), position, message.publish_timestamp())


def _open(client: pulsar.Client, topic: str, start: Position, inclusive: bool, queue: int = 1000) -> pulsar.Reader:
    """A reader from `start`; `queue` bounds what the broker sends ahead of what is read (and reads for it)."""
    start_id = (
        pulsar.MessageId.earliest if start == BEFORE_EVERYTHING
        else pulsar.MessageId(-1, start[0], start[1], start[2])
    )  # fmt: skip
    return client.create_reader(topic, start_id, start_message_id_inclusive=inclusive, receiver_queue_size=queue)


def read_range(client: pulsar.Client, admin: PulsarAdmin, topic: str, command: ReadRange) -> RangeRead:
    """The markers in (start, stop] and the first entry the reader delivered.

    The read ends at the first entry past `stop`, or where the broker says the partition ends. A
    read that merely times out (a broker restarting) is not an end: a fold that stopped there would
    miss markers. When the reader left the start's ledger at once, the partition's ledgers are read
    after it (the engine refuses the fold if that ledger is gone).
    """
    start, stop = command.start, command.stop
    try:
        reader = _open(client, topic, start, inclusive=False)
    except pulsar.PulsarException as exc:
        return RangeRead(command.request, None, (), frozenset(), error=f"{type(exc).__name__}: {exc}")
    deadline = time.monotonic() + FOLD_READ_LIMIT_S
    first: Position | None = None
    markers: list[RawMarker] = []
    entries = 0
    try:
        while True:
            try:
                message = reader.read_next(timeout_millis=5_000)
            except pulsar.Timeout:
                if not has_message_available(reader):  # raises when the broker did not answer: not an end
                    break  # the partition ends before `stop`
                if time.monotonic() > deadline:
                    return RangeRead(command.request, first, (), frozenset(), error=(
                        f"reading {topic} from {start[:2]} to {stop[:2]} kept timing out for "
                        f"{FOLD_READ_LIMIT_S:.0f} s although the broker has more"
                    ))  # fmt: skip
                continue
            entries += 1
            position = message_position(message)
            if first is None:
                first = position
            if position <= start:
                continue
            if position > stop:
                break
            marker = raw_marker(message, position)
            if marker is not None:
                markers.append(marker)
        ledgers: frozenset[int] = frozenset()
        if first is not None and start != BEFORE_EVERYTHING and first[0] != start[0]:
            ledgers = frozenset(int(info["ledgerId"]) for info in admin.internal_stats(topic).get("ledgers", []))
        return RangeRead(command.request, first, (), ledgers, entries=entries, raw=tuple(markers))
    except Exception as exc:  # a broker away, an admin call failing: the engine retries later
        return RangeRead(command.request, None, (), frozenset(), error=f"{type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(pulsar.PulsarException):
            reader.close()


def read_marker_at(client: pulsar.Client, topic: str, command: ReadMarkerAt) -> MarkerFetched:
    """The marker at one position (a link of the snapshot chain); None when it is not there (deleted)."""
    position = command.position
    try:
        reader = _open(client, topic, position, inclusive=True, queue=1)  # one entry wanted: none read ahead
    except pulsar.PulsarException as exc:
        return MarkerFetched(command.request, position, None, error=f"{type(exc).__name__}: {exc}")
    try:
        message = reader.read_next(timeout_millis=10_000)
        if message_position(message) != position:
            return MarkerFetched(command.request, position, None)
        return MarkerFetched(command.request, position, None, raw=raw_marker(message, position))
    except pulsar.Timeout:
        try:
            if not has_message_available(reader):  # the broker says nothing is there: deleted
                return MarkerFetched(command.request, position, None)
            error = "the entry did not come although the broker has more"
        except NotAnswered as exc:
            error = str(exc)
        return MarkerFetched(command.request, position, None, error=error)
    except Exception as exc:
        return MarkerFetched(command.request, position, None, error=f"{type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(pulsar.PulsarException):
            reader.close()
