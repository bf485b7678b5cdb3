package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

class GrantsTest {
    /** The broker's authorization as a table, counting the questions it is asked. */
    private static final class Broker implements Grants.Check<String> {
        final Set<String> granted; // "role namespace"
        final List<String> asked = new ArrayList<>();
        boolean failing;

        Broker(String... granted) {
            this.granted = new java.util.HashSet<>(List.of(granted));
        }

        @Override
        public boolean allowed(String role, String namespace, String authentication) throws Exception {
            asked.add(role + " " + namespace);
            if (failing) {
                throw new IllegalStateException("the metadata store does not answer");
            }
            return granted.contains(role + " " + namespace);
        }
    }

    private final AtomicLong now = new AtomicLong(1_000);

    @Test
    void aVerdictIsAskedOncePerRoleAndNamespaceWhileItIsFresh() {
        Broker broker = new Broker("gen t/ours");
        Grants<String> grants = new Grants<String>(broker, now::get, 10_000, 100);
        assertTrue(grants.allowed("gen", "t/ours", "token"));
        assertFalse(grants.allowed("gen", "t/theirs", "token"));
        assertTrue(grants.allowed("gen", "t/ours", "token"));
        assertFalse(grants.allowed("gen", "t/theirs", "token"));
        assertFalse(grants.allowed("other", "t/ours", "token")); // another role is asked of its own
        assertEquals(List.of("gen t/ours", "gen t/theirs", "other t/ours"), broker.asked);
    }

    @Test
    void aRevokedGrantCountsOnceTheVerdictIsOlderThanItsTimeToLive() {
        Broker broker = new Broker("gen t/ours");
        Grants<String> grants = new Grants<String>(broker, now::get, 10_000, 100);
        assertTrue(grants.allowed("gen", "t/ours", "token"));
        broker.granted.clear();
        now.addAndGet(9_999);
        assertTrue(grants.allowed("gen", "t/ours", "token"));
        now.addAndGet(1);
        assertFalse(grants.allowed("gen", "t/ours", "token"));
        assertEquals(2, broker.asked.size());
    }

    @Test
    void aBrokerThatCannotTellRefusesAndIsAskedAgainNextTime() {
        Broker broker = new Broker("gen t/ours");
        Grants<String> grants = new Grants<String>(broker, now::get, 10_000, 100);
        broker.failing = true;
        assertFalse(grants.allowed("gen", "t/ours", "token"));
        assertNull(grants.known("gen", "t/ours"));
        broker.failing = false;
        assertTrue(grants.allowed("gen", "t/ours", "token"));
    }

    @Test
    void theFirstNamedNamespaceItMayNotReadIsNamed() {
        Grants<String> grants = new Grants<String>(new Broker("gen t/a", "gen t/b"), now::get, 10_000, 100);
        assertNull(grants.firstRefused("gen", List.of("t/a", "t/b"), "token"));
        assertEquals("t/c", grants.firstRefused("gen", List.of("t/a", "t/c", "t/d"), "token"));
    }

    @Test
    void whatIsRememberedStaysBounded() {
        Broker broker = new Broker();
        Grants<String> grants = new Grants<String>(broker, now::get, 10_000, 3);
        for (int i = 0; i < 10; i++) {
            grants.allowed("gen", "t/ns" + i, "token");
            assertTrue(grants.size() <= 3, "remembered " + grants.size());
        }
    }

    @Test
    void aRoleSeesOnlyTopicsOfNamespacesItMayConsumeDecidedOutsideTheReportsLock() {
        Broker broker = new Broker("gen t/ours");
        Grants<String> grants = new Grants<String>(broker, now::get, 10_000, 100);
        CursorReport report = new CursorReport("run", 10);
        report.update("persistent://t/ours/a", CursorReportTest.cursors(1));
        report.update("persistent://t/theirs/b", CursorReportTest.cursors(2));
        report.announce(List.of("persistent://t/theirs/new", "persistent://t/ours/new"));
        Thread[] askedFrom = new Thread[1];
        Grants.Check<String> watching = (role, namespace, authentication) -> {
            assertFalse(Thread.holdsLock(report), "the broker is asked while the report is locked");
            askedFrom[0] = Thread.currentThread();
            return broker.allowed(role, namespace, authentication);
        };
        Grants<String> checked = new Grants<String>(watching, now::get, 10_000, 100);
        Changes seen = checked.visible("gen", "token", topic -> true, wanted -> report.since("other-run", 0, wanted));
        assertEquals(Set.of("persistent://t/ours/a"), seen.topics().keySet());
        assertTrue(seen.full());
        Changes fresh = checked.visible("gen", "token", topic -> true, wanted -> report.since("run", 2, wanted));
        assertEquals(List.of("persistent://t/ours/new"), fresh.fresh());
        assertEquals(report.since("run", 2).seq(), fresh.seq());
        assertEquals(Thread.currentThread(), askedFrom[0]);
        assertEquals(List.of("gen t/ours", "gen t/theirs"), broker.asked.stream().sorted().toList());
        // what the request names narrows it further
        Changes named = grants.visible("gen", "token", Namespaces.parse("t/theirs"),
                wanted -> report.since("other-run", 0, wanted));
        assertEquals(Map.of(), named.topics());
    }

    @Test
    void aNamespaceThatAppearsBetweenTheQuestionsAndTheAnswerIsAskedBeforeTheAnswerIsGiven() {
        Broker broker = new Broker("gen t/ours", "gen t/late");
        Grants<String> grants = new Grants<String>(broker, now::get, 10_000, 100);
        CursorReport report = new CursorReport("run", 10);
        report.update("persistent://t/ours/a", CursorReportTest.cursors(1));
        int[] queries = {0};
        Changes seen = grants.visible("gen", "token", topic -> true, wanted -> {
            if (++queries[0] == 2) { // a topic of a namespace never asked about comes while the first one is asked
                report.update("persistent://t/late/b", CursorReportTest.cursors(2));
            }
            return report.since("run", 0, wanted);
        });
        assertEquals(Set.of("persistent://t/ours/a", "persistent://t/late/b"), seen.topics().keySet());
        assertEquals(2, seen.seq()); // nothing that counts in seq was skipped unasked
    }
}
