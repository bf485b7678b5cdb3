package org.pulsarwatermarks.cursors;

import java.util.List;
import java.util.SortedMap;

/**
 * What the generator needs of one topic partition, as its internal stats would say it: every durable
 * subscription's mark-delete position (the generator's own {@code __wm_generator} among them), the
 * active consumer of {@code __wm_generator} (who owns the partition), the last entry written and the
 * ledgers, and when the topic was created (ms; 0 unknown), which tells a topic deleted and created again under
 * its name from the one before. A plain value: two reads that say the same are equal, so only real moves are reported.
 */
public record TopicCursors(
        SortedMap<String, Position> cursors, String owner, Position lastConfirmed, List<Ledger> ledgers, long created) {

    /**
     * Whether a generator must be told: a cursor, the owner or the ledgers changed. A new last entry
     * alone is not news (it changes with every message published); it is told with the next move.
     */
    public boolean movedFrom(TopicCursors before) {
        return before == null || !cursors.equals(before.cursors) || !java.util.Objects.equals(owner, before.owner)
                || !ledgers.equals(before.ledgers) || created != before.created;
    }

    /** (ledger id, entry id), as the admin API writes positions. */
    public record Position(long ledger, long entry) {}

    /** A ledger of the topic and how many entries it holds (0 for the ledger still being written). */
    public record Ledger(long id, long entries) {}
}
