package org.pulsarwatermarks.cursors;

import java.util.List;
import java.util.SortedMap;

/**
 * What the generator needs of one topic partition, as its internal stats would say it: every durable
 * subscription's mark-delete position (the generator's own {@code __wm_generator} among them), the
 * active consumer of {@code __wm_generator} (who owns the partition), the last entry written and the
 * ledgers, when the topic was created (ms; 0 unknown), which tells a topic deleted and created again under
 * its name from the one before, and its incarnation property {@code wm.incarnation} (null: unset), which a generator
 * taking the topic over would otherwise read through the admin API. A plain value: two reads that say the same are
 * equal, so only real moves are reported.
 */
public record TopicCursors(SortedMap<String, Position> cursors, String owner, Position lastConfirmed,
        List<Ledger> ledgers, long created, String incarnation) {

    /**
     * Whether a generator must be told: an application's cursor, the owner, the ledgers or the incarnation changed. A new
     * last entry alone is not news (it changes with every message published), nor is the generator's own
     * cursor moving (it acknowledged a snapshot: it knows); both are told with the next move.
     */
    public boolean movedFrom(TopicCursors before) {
        return before == null || !applications().equals(before.applications())
                || !java.util.Objects.equals(owner, before.owner) || !ledgers.equals(before.ledgers)
                || created != before.created || !java.util.Objects.equals(incarnation, before.incarnation);
    }

    private SortedMap<String, Position> applications() {
        SortedMap<String, Position> others = new java.util.TreeMap<>(cursors);
        others.remove(BrokerCursors.GENERATOR_SUBSCRIPTION);
        return others;
    }

    /** (ledger id, entry id), as the admin API writes positions. */
    public record Position(long ledger, long entry) {}

    /** A ledger of the topic and how many entries it holds (0 for the ledger still being written). */
    public record Ledger(long id, long entries) {}
}
