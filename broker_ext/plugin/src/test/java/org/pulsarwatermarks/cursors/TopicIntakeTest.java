package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class TopicIntakeTest {
    static MarkerScanner.Marker marker(long entry, String producer, String kind) {
        return new MarkerScanner.Marker(5, entry, -1, 0, producer, kind, kind.getBytes(StandardCharsets.UTF_8),
                1_000 + entry, false);
    }

    static String text(TopicIntake.Found found) {
        if (found instanceof TopicIntake.MarkerFound m) {
            return m.marker().kind() + "@" + m.marker().entryId() + " by " + m.marker().producer();
        }
        TopicIntake.DataFound d = (TopicIntake.DataFound) found;
        return "data " + d.first().ledger() + ":" + d.first().entry() + ".." + d.last().ledger() + ":"
                + d.last().entry() + " " + new java.util.TreeMap<>(d.producers());
    }

    static List<String> texts(TopicIntake.Batch batch) {
        return batch.found().stream().map(TopicIntakeTest::text).toList();
    }

    @Test
    void markersAndTheDataBetweenComeInLogOrderTheDataOfAStretchSummedPerProducer() {
        TopicIntake intake = new TopicIntake(100);
        intake.data("a", 5, 1, -1, 10, 300, 1);
        intake.data("b", 5, 2, -1, 1, 250, 2);
        intake.data("a", 5, 3, -1, 5, 200, 3);
        intake.marker(marker(4, "a", "W_SET"), 4);
        intake.data("a", 5, 5, -1, 1, MarkerScanner.NO_EVENT_TIME, 5);
        intake.scannedTo(new TopicCursors.Position(5, 6));
        TopicIntake.Batch batch = intake.since(-1);
        assertEquals(List.of(
                "data 5:1..5:3 {a=Stretch[messages=15, lowestEventTime=200], b=Stretch[messages=1, lowestEventTime=250]}",
                "W_SET@4 by a",
                "data 5:5..5:5 {a=Stretch[messages=1, lowestEventTime=" + MarkerScanner.NO_EVENT_TIME + "]}"),
                texts(batch));
        assertEquals(new TopicCursors.Position(5, 6), batch.scannedTo());
        assertFalse(batch.overflowed());
    }

    @Test
    void onlyWhatWasFoundSinceASequenceIsToldAndAStretchThatGrewIsToldWhole() {
        TopicIntake intake = new TopicIntake(100);
        intake.marker(marker(1, "a", "W_SET"), 1);
        intake.data("a", 5, 2, -1, 1, 10, 2);
        assertEquals(List.of("W_SET@1 by a", "data 5:2..5:2 {a=Stretch[messages=1, lowestEventTime=10]}"),
                texts(intake.since(0)));
        intake.data("a", 5, 3, -1, 1, 5, 3);
        assertEquals(List.of("data 5:2..5:3 {a=Stretch[messages=2, lowestEventTime=5]}"), texts(intake.since(2)));
        assertEquals(List.of(), texts(intake.since(3)));
    }

    @Test
    void whatTheGeneratorAcknowledgedIsForgottenAndARestartedGeneratorGetsTheRest() {
        TopicIntake intake = new TopicIntake(100);
        intake.marker(marker(1, "a", "W_SET"), 1);
        intake.data("a", 5, 2, -1, 1, 10, 2);
        intake.marker(marker(3, "a", "W_SET"), 3);
        intake.marker(marker(4, "b", "W_IDLE"), 4);
        intake.acknowledged(new TopicCursors.Position(5, 3));
        assertEquals(List.of("W_IDLE@4 by b"), texts(intake.since(-1))); // a generator that knows nothing
        assertEquals(1, intake.size());
        intake.acknowledged(new TopicCursors.Position(5, 2)); // an older acknowledgement changes nothing
        assertEquals(1, intake.size());
    }

    @Test
    void aGeneratorFarBehindIsToldThatItMustReadTheLogItselfAndNothingIsKeptPastTheLimit() {
        TopicIntake intake = new TopicIntake(3);
        for (long entry = 1; entry <= 5; entry++) {
            intake.marker(marker(entry, "a", "W_SET"), entry);
        }
        TopicIntake.Batch batch = intake.since(-1);
        assertTrue(batch.overflowed());
        assertEquals(List.of(), batch.found());
        assertEquals(0, intake.size());
        intake.acknowledged(new TopicCursors.Position(5, 5)); // it read up to there through the log: back to normal
        intake.marker(marker(6, "a", "W_SET"), 6);
        batch = intake.since(-1);
        assertFalse(batch.overflowed());
        assertEquals(List.of("W_SET@6 by a"), texts(batch));
    }

    @Test
    void allTopicsTogetherKeepNoMoreThanTheBrokersBudgetTheTopicThatFindsItFullReadsTheLogItself() {
        TopicIntake.Budget budget = new TopicIntake.Budget(5);
        TopicIntake a = new TopicIntake(100, budget);
        TopicIntake b = new TopicIntake(100, budget);
        for (long entry = 1; entry <= 3; entry++) {
            a.marker(marker(entry, "a", "W_SET"), entry);
        }
        b.marker(marker(1, "b", "W_SET"), 4);
        b.marker(marker(2, "b", "W_SET"), 5);
        assertEquals(5, budget.used());
        b.marker(marker(3, "b", "W_SET"), 6); // the broker's budget is spent: b drops what it kept
        assertTrue(b.since(-1).overflowed());
        assertEquals(0, b.size());
        assertFalse(a.since(-1).overflowed());
        assertEquals(3, a.size());
        assertEquals(3, budget.used());
        a.acknowledged(new TopicCursors.Position(5, 2)); // what is forgotten is given back
        assertEquals(1, budget.used());
        a.release(); // a topic no longer read gives back all it kept
        assertEquals(0, budget.used());
        assertEquals(0, a.size());
    }

    @Test
    void entriesBeforeWhatWasAcknowledgedAreNotKept() {
        TopicIntake intake = new TopicIntake(100);
        intake.acknowledged(new TopicCursors.Position(5, 10));
        intake.marker(marker(9, "a", "W_SET"), 1); // scanned late (a generator acknowledged past it already)
        intake.data("a", 5, 10, -1, 1, 1, 2);
        assertEquals(0, intake.size());
    }

    @Test
    void theDataOfOneProducerInTwoStretchesIsNotMergedAcrossAMarker() {
        TopicIntake intake = new TopicIntake(100);
        intake.data("a", 5, 1, -1, 1, 10, 1);
        intake.marker(marker(2, "b", "W_SET"), 2);
        intake.data("a", 5, 3, -1, 1, 5, 3);
        Map<String, TopicIntake.Stretch> last = ((TopicIntake.DataFound) intake.since(-1).found().get(2)).producers();
        assertEquals(Map.of("a", new TopicIntake.Stretch(1, 5)), last);
    }
}
