package org.pulsarwatermarks.cursors;

import java.util.List;
import java.util.Map;

/**
 * One answer to a generator: the topics whose cursors changed since the sequence number it knew.
 *
 * <p>{@code full} means the answer lists every followed topic this broker serves, and a topic not
 * in it is not served here: the generator's sequence number came from another run of the broker
 * (the epoch changed) or from before what this broker still remembers of removed topics. {@code fresh}
 * names topics that no generator follows yet where a producer or consumer just appeared: a generator
 * that follows their namespace can start at once instead of at its next look at the topic list. {@code intake},
 * for a generator that asked for it, holds what {@link TopicIntake} found on each listed topic since then.
 */
public record Changes(
        String epoch, long seq, boolean full, Map<String, TopicCursors> topics, List<String> gone, List<String> fresh,
        Map<String, TopicIntake.Batch> intake) {

    /** Without the intake: for a generator that did not ask for it. */
    public Changes(String epoch, long seq, boolean full, Map<String, TopicCursors> topics, List<String> gone,
            List<String> fresh) {
        this(epoch, seq, full, topics, gone, fresh, Map.of());
    }

    public boolean isEmpty() {
        return !full && topics.isEmpty() && gone.isEmpty() && fresh.isEmpty();
    }
}
