package org.pulsarwatermarks.cursors;

import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.List;
import java.util.SortedMap;
import java.util.TreeMap;
import org.apache.bookkeeper.mledger.ManagedCursor;
import org.apache.bookkeeper.mledger.ManagedLedger;
import org.apache.bookkeeper.mledger.impl.ManagedLedgerImpl;
import org.apache.pulsar.broker.service.AbstractDispatcherSingleActiveConsumer;
import org.apache.pulsar.broker.service.Consumer;
import org.apache.pulsar.broker.service.persistent.PersistentSubscription;
import org.apache.pulsar.broker.service.persistent.PersistentTopic;
import org.apache.pulsar.metadata.api.Stat;

/** Reads a loaded topic's cursors out of the broker's memory: the edge where Pulsar's types are adapted. */
final class BrokerCursors {
    /** The generator's subscription: a topic is followed exactly when it has one. */
    static final String GENERATOR_SUBSCRIPTION = "__wm_generator";

    private BrokerCursors() {}

    static boolean followed(PersistentTopic topic) {
        return topic.getSubscriptions().containsKey(GENERATOR_SUBSCRIPTION);
    }

    /** The topic's cursors now, or null when no generator follows it. */
    static TopicCursors read(PersistentTopic topic) {
        PersistentSubscription generator = topic.getSubscriptions().get(GENERATOR_SUBSCRIPTION);
        if (generator == null) {
            return null;
        }
        SortedMap<String, TopicCursors.Position> cursors = new TreeMap<>();
        topic.getSubscriptions().forEach((name, subscription) -> {
            ManagedCursor cursor = subscription.getCursor();
            if (cursor != null && cursor.isDurable()) {
                cursors.put(name, position(cursor.getMarkDeletedPosition()));
            }
        });
        ManagedLedger ledger = topic.getManagedLedger();
        List<TopicCursors.Ledger> ledgers = new ArrayList<>();
        ledger.getLedgersInfo().values().forEach(info -> ledgers.add(new TopicCursors.Ledger(info.getLedgerId(), info.getEntries())));
        return new TopicCursors(cursors, activeConsumer(generator), position(ledger.getLastConfirmedEntry()), ledgers,
                created(ledger), ledger.getProperties().get(Follows.INCARNATION_PROPERTY));
    }

    private static final Field LEDGERS_STAT = ledgersStat();

    private static Field ledgersStat() {
        try {
            Field field = ManagedLedgerImpl.class.getDeclaredField("ledgersStat");
            field.setAccessible(true);
            return field;
        } catch (ReflectiveOperationException | RuntimeException e) {
            return null; // another Pulsar version: the creation time is unknown (0), as through the admin API
        }
    }

    /**
     * When the topic's managed ledger was created in the metadata store: a topic deleted and created again under
     * its name has another. Pulsar keeps it in a field it does not expose, hence the reflection; 0 when unknown.
     */
    static long created(ManagedLedger ledger) {
        try {
            if (LEDGERS_STAT != null && LEDGERS_STAT.get(ledger) instanceof Stat stat) {
                return stat.getCreationTimestamp();
            }
        } catch (ReflectiveOperationException | RuntimeException e) {
            // unknown
        }
        return 0;
    }

    private static String activeConsumer(PersistentSubscription subscription) {
        if (subscription.getDispatcher() instanceof AbstractDispatcherSingleActiveConsumer dispatcher) {
            Consumer active = dispatcher.getActiveConsumer();
            return active == null ? null : active.consumerName();
        }
        return null;
    }

    private static TopicCursors.Position position(org.apache.bookkeeper.mledger.Position position) {
        return position == null
                ? new TopicCursors.Position(-1, -1)
                : new TopicCursors.Position(position.getLedgerId(), position.getEntryId());
    }
}
