package org.pulsarwatermarks.cursors;

import java.util.Map;
import java.util.function.Consumer;
import javax.servlet.ServletRequest;
import javax.servlet.ServletResponse;
import javax.servlet.http.HttpServletRequest;
import org.apache.pulsar.broker.PulsarService;
import org.apache.pulsar.broker.intercept.BrokerInterceptor;
import org.apache.pulsar.broker.service.Producer;
import org.apache.pulsar.broker.service.ServerCnx;
import org.apache.pulsar.broker.service.Subscription;
import org.apache.pulsar.common.api.proto.BaseCommand;
import org.apache.pulsar.common.api.proto.CommandAck;

/**
 * The broker's hooks: names the topic whose cursors may have moved, and changes nothing.
 *
 * <p>The broker loads interceptors and servlets in class loaders of their own, so the servlet, which
 * keeps the report, hands this interceptor its tracker's hooks as a map of {@code Consumer<String>} by name (JDK
 * types both loaders share) through {@link #accept}; each event calls its own hook. {@code messageAcked} runs after the cursor's mark-delete position moved in
 * memory; seeks ask for a sweep and admin calls (reset, expiry, unsubscribe, unload, delete) for a read
 * of the topic they name ({@link AdminRequests}), a little later, since the cursor moves after the hook.
 */
public final class CursorInterceptor implements BrokerInterceptor, Consumer<Map<String, Consumer<String>>> {
    /** The names of the tracker's hooks ({@link CursorTracker#hooks}). */
    static final String MOVED = "moved";
    static final String FRESH = "fresh";
    static final String AFTER_ADMIN = "afterAdmin";
    static final String SWEEP = "sweep";

    /** What each hook is told: a topic whose cursors may have moved, one a producer or consumer appeared on that
     * no generator follows, one an admin call named, or any (the argument unused). */
    private record Hooks(Consumer<String> moved, Consumer<String> fresh, Consumer<String> afterAdmin,
            Consumer<String> sweep) {
        static Hooks of(Map<String, Consumer<String>> named) {
            Consumer<String> none = topic -> {};
            return new Hooks(named.getOrDefault(MOVED, none), named.getOrDefault(FRESH, none),
                    named.getOrDefault(AFTER_ADMIN, none), named.getOrDefault(SWEEP, none));
        }
    }

    private volatile Hooks hooks = Hooks.of(Map.of());

    /** The servlet's tracker, by its hooks' names. */
    @Override
    public void accept(Map<String, Consumer<String>> named) {
        this.hooks = Hooks.of(named);
    }

    @Override
    public void messageAcked(ServerCnx cnx, org.apache.pulsar.broker.service.Consumer consumer, CommandAck ack) {
        touched(consumer);
    }

    @Override
    public void consumerCreated(ServerCnx cnx, org.apache.pulsar.broker.service.Consumer consumer,
            java.util.Map<String, String> metadata) {
        if (!touched(consumer) && consumer.getSubscription() != null) {
            hooks.fresh().accept(consumer.getSubscription().getTopicName());
        }
    }

    @Override
    public void producerCreated(ServerCnx cnx, Producer producer, java.util.Map<String, String> metadata) {
        if (producer.getTopic().getSubscription(BrokerCursors.GENERATOR_SUBSCRIPTION) == null) {
            hooks.fresh().accept(producer.getTopic().getName()); // a topic a generator may follow
        }
    }

    @Override
    public void consumerClosed(ServerCnx cnx, org.apache.pulsar.broker.service.Consumer consumer,
            java.util.Map<String, String> metadata) {
        touched(consumer);
    }

    /** Names the consumer's topic if a generator follows it; whether it does. */
    private boolean touched(org.apache.pulsar.broker.service.Consumer consumer) {
        Subscription subscription = consumer.getSubscription();
        if (subscription != null && subscription.getTopic().getSubscription(BrokerCursors.GENERATOR_SUBSCRIPTION) != null) {
            hooks.moved().accept(subscription.getTopicName());
            return true;
        }
        return false;
    }

    @Override
    public void onPulsarCommand(BaseCommand command, ServerCnx cnx) {
        switch (command.getType()) {
            case SEEK, UNSUBSCRIBE -> hooks.sweep().accept(null);
            default -> { }
        }
    }

    @Override
    public void onWebserviceResponse(ServletRequest request, ServletResponse response) {
        if (request instanceof HttpServletRequest http) {
            AdminRequests.Touched touched = AdminRequests.touched(http.getMethod(), http.getRequestURI());
            if (touched == AdminRequests.Touched.EVERY_TOPIC) {
                hooks.sweep().accept(null); // a namespace-wide call: any topic may have moved
            } else if (touched != null) {
                hooks.afterAdmin().accept(touched.topic()); // a reset, skip, expiry, unload or delete
            }
        }
    }

    @Override
    public void onWebserviceRequest(ServletRequest request) {}

    @Override
    public void onConnectionClosed(ServerCnx cnx) {}

    @Override
    public void initialize(PulsarService pulsar) {}

    @Override
    public void close() {}
}
