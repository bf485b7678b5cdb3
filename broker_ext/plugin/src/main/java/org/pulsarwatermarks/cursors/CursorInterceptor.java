package org.pulsarwatermarks.cursors;

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
 * keeps the report, hands this interceptor a {@code Consumer<String>} (a JDK type both loaders share)
 * through {@link #accept}. {@code messageAcked} runs after the cursor's mark-delete position moved in
 * memory; seeks ask for a sweep and admin calls (reset, expiry, unsubscribe, unload, delete) for a read
 * of the topic they name ({@link AdminRequests}), a little later, since the cursor moves after the hook.
 */
public final class CursorInterceptor implements BrokerInterceptor, Consumer<Consumer<String>> {
    private volatile Consumer<String> listener = topic -> {};

    /** The servlet's listener of topics that may have moved. */
    @Override
    public void accept(Consumer<String> listener) {
        this.listener = listener;
    }

    @Override
    public void messageAcked(ServerCnx cnx, org.apache.pulsar.broker.service.Consumer consumer, CommandAck ack) {
        touched(consumer);
    }

    @Override
    public void consumerCreated(ServerCnx cnx, org.apache.pulsar.broker.service.Consumer consumer,
            java.util.Map<String, String> metadata) {
        if (!touched(consumer) && consumer.getSubscription() != null) {
            listener.accept(CursorTracker.FRESH + consumer.getSubscription().getTopicName());
        }
    }

    @Override
    public void producerCreated(ServerCnx cnx, Producer producer, java.util.Map<String, String> metadata) {
        if (producer.getTopic().getSubscription(BrokerCursors.GENERATOR_SUBSCRIPTION) == null) {
            listener.accept(CursorTracker.FRESH + producer.getTopic().getName()); // a topic a generator may follow
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
            listener.accept(subscription.getTopicName());
            return true;
        }
        return false;
    }

    @Override
    public void onPulsarCommand(BaseCommand command, ServerCnx cnx) {
        switch (command.getType()) {
            case SEEK, UNSUBSCRIBE -> listener.accept(CursorTracker.EVERYTHING);
            default -> { }
        }
    }

    @Override
    public void onWebserviceResponse(ServletRequest request, ServletResponse response) {
        if (request instanceof HttpServletRequest http) {
            String touched = AdminRequests.touched(http.getMethod(), http.getRequestURI());
            if (CursorTracker.EVERYTHING.equals(touched)) {
                listener.accept(touched); // a namespace-wide call: any topic may have moved
            } else if (touched != null) {
                listener.accept(CursorTracker.AFTER_ADMIN + touched); // a reset, skip, expiry, unload or delete
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
