package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.function.Predicate;
import org.junit.jupiter.api.Test;

class CursorReportTest {
    static TopicCursors cursors(long acknowledged) {
        return cursors(acknowledged, 20);
    }

    static TopicCursors cursors(long acknowledged, long lastEntry) {
        TreeMap<String, TopicCursors.Position> map = new TreeMap<>();
        map.put("__wm_generator", new TopicCursors.Position(5, 1));
        map.put("app", new TopicCursors.Position(5, acknowledged));
        return new TopicCursors(map, "gen-1", new TopicCursors.Position(5, lastEntry), List.of(new TopicCursors.Ledger(5, 0)), 1_700_000_000_000L, "0123456789abcdef");
    }

    @Test
    void aGeneratorOfAnotherRunGetsEverythingAsFull() {
        CursorReport report = new CursorReport("run-2", 10);
        report.update("a", cursors(3));
        report.update("b", cursors(4));
        Changes changes = report.since("run-1", 17);
        assertTrue(changes.full());
        assertEquals(Map.of("a", cursors(3), "b", cursors(4)), changes.topics());
        assertEquals("run-2", changes.epoch());
        assertEquals(2, changes.seq());
    }

    @Test
    void onlyWhatChangedSinceIsTold() {
        CursorReport report = new CursorReport("run", 10);
        report.update("a", cursors(3));
        report.update("b", cursors(4));
        long known = report.since("run", -1).seq();
        report.update("a", cursors(3)); // the same: no change
        assertTrue(report.since("run", known).isEmpty());
        report.update("b", cursors(9));
        Changes changes = report.since("run", known);
        assertFalse(changes.full());
        assertEquals(Map.of("b", cursors(9)), changes.topics());
    }

    @Test
    void messagesPublishedAloneAreNoNewsButTravelWithTheNextMove() {
        CursorReport report = new CursorReport("run", 10);
        report.update("a", cursors(3, 20));
        long known = report.since("run", -1).seq();
        report.update("a", cursors(3, 90));
        assertTrue(report.since("run", known).isEmpty());
        report.update("a", cursors(4, 95));
        assertEquals(Map.of("a", cursors(4, 95)), report.since("run", known).topics());
    }

    static MarkerScanner.Marker marker(long entry) {
        return new MarkerScanner.Marker(5, entry, -1, 0, "p", "W_SET", new byte[] {1}, 1_000, false);
    }

    static List<Long> markersOf(Changes changes, String topic) {
        return changes.intake().get(topic).found().stream()
                .map(found -> ((TopicIntake.MarkerFound) found).marker().entryId()).toList();
    }

    @Test
    void markersFoundOnAFollowedTopicAreToldOnceWithItsCursorsAndAKnowNothingGeneratorGetsAllKept() {
        CursorReport report = new CursorReport("run", 10);
        TopicIntake intake = new TopicIntake(100);
        report.update("a", cursors(3));
        long known = report.since("run", -1).seq();
        assertTrue(report.found("a", seq -> intake.marker(marker(7), seq)));
        Changes changes = report.since("run", known, topic -> true, topic -> intake);
        assertEquals(Map.of("a", cursors(3)), changes.topics()); // told again, with what was found
        assertEquals(List.of(7L), markersOf(changes, "a"));
        report.found("a", seq -> intake.marker(marker(8), seq));
        assertEquals(List.of(8L), markersOf(report.since("run", changes.seq(), topic -> true, topic -> intake), "a"));
        assertEquals(List.of(7L, 8L), markersOf(report.since("other-run", 0, topic -> true, topic -> intake), "a"));
        assertEquals(Map.of(), report.since("run", known).intake()); // a generator that did not ask: no intake
    }

    @Test
    void whatIsFoundOnATopicNotReportedIsNotKept() {
        CursorReport report = new CursorReport("run", 10);
        TopicIntake intake = new TopicIntake(100);
        assertFalse(report.found("a", seq -> intake.marker(marker(7), seq)));
        assertEquals(0, intake.size());
        report.update("a", cursors(3));
        report.remove("a");
        assertFalse(report.found("a", seq -> intake.marker(marker(7), seq)));
        assertEquals(0, intake.size());
    }

    @Test
    void theGeneratorsOwnAcknowledgementIsNoNews() {
        CursorReport report = new CursorReport("run", 10);
        report.update("a", cursors(3));
        long known = report.since("run", -1).seq();
        TreeMap<String, TopicCursors.Position> moved = new TreeMap<>(cursors(3).cursors());
        moved.put("__wm_generator", new TopicCursors.Position(5, 3));
        TopicCursors c = cursors(3);
        report.update("a", new TopicCursors(moved, c.owner(), c.lastConfirmed(), c.ledgers(), c.created(), c.incarnation()));
        assertTrue(report.since("run", known).isEmpty());
    }

    @Test
    void theIncarnationPropertySetOrChangedIsNews() {
        CursorReport report = new CursorReport("run", 10);
        TopicCursors c = cursors(3);
        TopicCursors unset = new TopicCursors(c.cursors(), c.owner(), c.lastConfirmed(), c.ledgers(), c.created(), null);
        report.update("a", unset);
        long known = report.since("run", -1).seq();
        report.update("a", c); // the generator's follow (or an admin call) set it: a standby takes it from here
        assertEquals(Map.of("a", c), report.since("run", known).topics());
    }

    @Test
    void aRemovedTopicIsToldGoneAndComesBackAsChanged() {
        CursorReport report = new CursorReport("run", 10);
        report.update("a", cursors(3));
        long known = report.since("run", -1).seq();
        report.remove("a");
        assertEquals(List.of("a"), report.since("run", known).gone());
        long after = report.since("run", known).seq();
        report.update("a", cursors(3)); // loaded again: reported again even though equal to before
        assertEquals(Map.of("a", cursors(3)), report.since("run", after).topics());
        assertEquals(List.of(), report.since("run", after).gone());
    }

    @Test
    void aGeneratorBehindWhatIsRememberedOfRemovedTopicsGetsAFullAnswer() {
        CursorReport report = new CursorReport("run", 2);
        for (String topic : List.of("a", "b", "c", "d")) {
            report.update(topic, cursors(1));
        }
        long known = report.since("run", -1).seq();
        report.remove("a");
        report.remove("b");
        report.remove("c"); // one more than remembered: "a" is forgotten
        Changes changes = report.since("run", known);
        assertTrue(changes.full());
        assertEquals(Map.of("d", cursors(1)), changes.topics());
        assertEquals(List.of(), changes.gone());
        Changes recent = report.since("run", report.since("run", -1).seq() - 1);
        assertFalse(recent.full());
        assertEquals(List.of("c"), recent.gone());
    }

    @Test
    void aTopicWhereAProducerAppearedIsAnnouncedUntilItIsFollowed() {
        CursorReport report = new CursorReport("run", 10);
        long known = report.since("run", -1).seq();
        report.announce("fresh");
        Changes changes = report.since("run", known);
        assertFalse(changes.isEmpty());
        assertEquals(List.of("fresh"), changes.fresh());
        report.update("fresh", cursors(1));
        assertEquals(List.of(), report.since("run", known).fresh()); // followed now: told as a topic
        long later = report.since("run", known).seq();
        report.announce("fresh"); // a second producer on a followed topic is no news
        assertTrue(report.since("run", later).isEmpty());
    }

    @Test
    void aSequenceFromTheFutureIsAnotherRun() {
        CursorReport report = new CursorReport("run", 10);
        report.update("a", cursors(1));
        assertTrue(report.since("run", 50).full()); // a broker restarted with the same epoch cannot happen; be safe
    }

    @Test
    void awaitReturnsOnTheChangeAndListenersHearIt() throws Exception {
        CursorReport report = new CursorReport("run", 10);
        int[] heard = {0};
        report.onChange(() -> heard[0]++);
        Thread writer = new Thread(() -> {
            try {
                Thread.sleep(50);
            } catch (InterruptedException e) {
                return;
            }
            report.update("a", cursors(7));
        });
        writer.start();
        long started = System.nanoTime();
        Changes changes = report.await("run", 0, topic -> true, 10_000);
        writer.join();
        assertEquals(Map.of("a", cursors(7)), changes.topics());
        assertTrue((System.nanoTime() - started) / 1_000_000 < 5_000);
        assertEquals(1, heard[0]);
    }

    @Test
    void awaitGivesUpEmptyAfterItsTimeout() throws Exception {
        CursorReport report = new CursorReport("run", 10);
        report.update("a", cursors(1));
        Changes changes = report.await("run", 1, topic -> true, 20);
        assertTrue(changes.isEmpty());
        assertEquals(1, changes.seq());
    }

    @Test
    void aGeneratorIsToldOnlyOfTheNamespacesItFollows() {
        CursorReport report = new CursorReport("run", 10);
        Predicate<String> ours = Namespaces.parse("t/ours,t/also");
        report.update("persistent://t/ours/a", cursors(3));
        report.update("persistent://t/theirs/b", cursors(4));
        Changes first = report.since("run", -1, ours);
        assertEquals(Set.of("persistent://t/ours/a"), first.topics().keySet());
        assertEquals(2, first.seq()); // the broker's sequence: what the generator asks from next
        report.update("persistent://t/theirs/b", cursors(9));
        report.announce("persistent://t/theirs/c");
        report.remove("persistent://t/theirs/b");
        assertTrue(report.since("run", first.seq(), ours).isEmpty()); // its long poll is not woken by them
        assertFalse(report.since("run", first.seq()).isEmpty());
        report.update("persistent://t/also/d-partition-1", cursors(1));
        report.announce("persistent://t/ours/e");
        Changes next = report.since("run", first.seq(), ours);
        assertEquals(Set.of("persistent://t/also/d-partition-1"), next.topics().keySet());
        assertEquals(List.of("persistent://t/ours/e"), next.fresh());
        assertEquals(Set.of("persistent://t/ours/a", "persistent://t/also/d-partition-1"),
                report.since("other-run", 0, ours).topics().keySet()); // a full answer is filtered too
    }

    @Test
    void withoutNamespacesEveryTopicIsWantedAndAMalformedOneIsRefused() {
        assertTrue(Namespaces.parse(null).test("persistent://x/y/z"));
        assertTrue(Namespaces.parse("").test("persistent://x/y/z"));
        assertFalse(Namespaces.parse("x/y").test("persistent://x/yy/z"));
        assertFalse(Namespaces.parse("x/y").test("non-persistent://x/y/z"));
        assertThrows(IllegalArgumentException.class, () -> Namespaces.parse("x"));
        assertThrows(IllegalArgumentException.class, () -> Namespaces.parse("x/y/z"));
    }

    @Test
    void topicsAnnouncedTogetherAreOneChangeForListenersAndEachHasItsSequence() {
        CursorReport report = new CursorReport("run", 10);
        int[] heard = {0};
        report.onChange(() -> heard[0]++);
        long known = report.since("run", -1).seq();
        report.announce(List.of("a", "b", "c"));
        assertEquals(1, heard[0]);
        Changes changes = report.since("run", known);
        assertEquals(List.of("a", "b", "c"), changes.fresh());
        assertEquals(known + 3, changes.seq());
        assertEquals(List.of("c"), report.since("run", known + 2).fresh());
        report.announce(List.of());
        assertEquals(1, heard[0]); // nothing announced: no change
    }
}
