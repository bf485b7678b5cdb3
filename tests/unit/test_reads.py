"""The generator's range read (`broker_ext.reads.read_range`) against a stand-in reader: where it may end."""

from __future__ import annotations

from typing import Any

import pulsar

from broker_ext.engine.partition import decode_raw
from broker_ext.engine.vocabulary import ReadRange
from broker_ext.reads import read_range
from tests.unit.fake_pulsar import FakeRaw, FakeReader, marker


class ImmediateReader(FakeReader):
    """Delivers what it holds; when empty, `read_next` times out at once (not after its timeout)."""

    def read_next(self, timeout_millis: int | None = None) -> FakeRaw:
        if self.queue.empty():
            raise pulsar.Timeout("read_next timed out")
        return self.queue.get_nowait()


class OneReaderClient:
    def __init__(self, reader: ImmediateReader) -> None:
        self.reader = reader

    def create_reader(self, *args: Any, **kwargs: Any) -> ImmediateReader:
        return self.reader


def reader_with_markers(*entries: int) -> ImmediateReader:
    reader = ImmediateReader()
    for entry in entries:
        reader.queue.put(marker(entry, 1000 + entry))
    return reader


def test_a_read_whose_question_for_more_went_unanswered_is_an_error_not_the_partitions_end() -> None:
    """Chaos seed 951483: the generator's connection was reset while the fold asked whether more was there;
    the client answered "no", the fold of (7, -1] to (7, 13] ended with no markers, and the generator
    published no watermark for a subscription that had one (a consumer's watermark taken away)."""
    reader = reader_with_markers()  # what the cut connection never delivered
    reader.unanswered = 1
    read = read_range(OneReaderClient(reader), None, "t", ReadRange(1, (7, -1, -1), (7, 13, -1)))  # type: ignore[arg-type]
    assert read.error is not None and "asking whether more is there" in read.error
    assert reader.closed


def test_a_read_ends_where_the_broker_says_the_partition_ends() -> None:
    reader = reader_with_markers(0, 1, 2)
    read = read_range(OneReaderClient(reader), None, "t", ReadRange(1, (7, -1, -1), (7, 13, -1)))  # type: ignore[arg-type]
    assert read.error is None
    assert [decode_raw(m).event_time for m in read.raw] == [1000, 1001, 1002]  # handed raw: the engine decodes
    assert read.first is not None and read.first[:2] == (7, 0)


def test_a_snapshot_read_that_times_out_unanswered_is_an_error_not_a_chain_that_ends() -> None:
    """A link of the snapshot chain that does not come within the read's wait is "not there" only when the broker
    says nothing more is there; a connection that went meanwhile is an error the engine retries (a chain taken as
    ended rebuilds from the partition's start, which retention may no longer hold)."""
    from broker_ext.engine.vocabulary import ReadMarkerAt
    from broker_ext.reads import read_marker_at

    reader = reader_with_markers()
    reader.unanswered = 1
    fetched = read_marker_at(OneReaderClient(reader), "t", ReadMarkerAt(1, (7, 5, -1)))  # type: ignore[arg-type]
    assert fetched.error is not None and fetched.marker is None
    reader = reader_with_markers()
    fetched = read_marker_at(OneReaderClient(reader), "t", ReadMarkerAt(1, (7, 5, -1)))  # type: ignore[arg-type]
    assert fetched.error is None and fetched.marker is None  # answered: nothing there
