package org.pulsarwatermarks.cursors;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Queue;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Consumer;
import java.util.function.Predicate;
import javax.servlet.AsyncContext;
import javax.servlet.AsyncEvent;
import javax.servlet.AsyncListener;
import javax.servlet.http.HttpServlet;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;
import org.apache.pulsar.broker.PulsarService;
import org.apache.pulsar.broker.ServiceConfiguration;
import org.apache.pulsar.broker.authentication.AuthenticationDataSource;
import org.apache.pulsar.broker.authorization.AuthorizationService;
import org.apache.pulsar.broker.intercept.BrokerInterceptor;
import org.apache.pulsar.broker.intercept.BrokerInterceptorWithClassLoader;
import org.apache.pulsar.broker.intercept.BrokerInterceptors;
import org.apache.pulsar.broker.web.AuthenticationFilter;
import org.apache.pulsar.broker.web.plugin.servlet.AdditionalServletWithPulsarService;
import org.apache.pulsar.common.configuration.PulsarConfiguration;
import org.apache.pulsar.common.naming.TopicName;
import org.eclipse.jetty.servlet.ServletHolder;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code GET /watermark-cursors/changes?epoch=E&since=N&timeoutMs=T}: the topics whose cursors moved
 * since sequence {@code N} of run {@code E}, answered at once when there are some, else when the
 * first comes or after {@code T} ms (a long poll that holds no Jetty thread while it waits).
 * Wire format and settings: docs/PROTOCOL.md, "The broker plugin".
 */
public final class CursorServlet extends HttpServlet implements AdditionalServletWithPulsarService {
    static final String BASE_PATH = "/watermark-cursors";
    private static final long MAX_WAIT_MS = 30_000;
    private static final Logger log = LoggerFactory.getLogger(CursorServlet.class);

    private final CursorReport report = new CursorReport();
    private final Queue<Waiter> waiters = new ConcurrentLinkedQueue<>();
    private long sweepIntervalMs = 2000;
    private String watermarkNamespace = "public/__watermarks";
    private PulsarService pulsar;
    private CursorTracker tracker;

    private record Waiter(
            AsyncContext context, String epoch, long since, Predicate<String> wanted, AtomicBoolean done) {}

    @Override
    public void loadConfig(PulsarConfiguration config) {
        var properties = config.getProperties();
        sweepIntervalMs = Long.parseLong(properties.getProperty("watermarkCursorsSweepIntervalMs", "2000"));
        watermarkNamespace = properties.getProperty("watermarkNamespace", watermarkNamespace);
    }

    @Override
    public void setPulsarService(PulsarService pulsar) {
        this.pulsar = pulsar;
        report.onChange(this::wakeWaiters);
        tracker = new CursorTracker(pulsar.getBrokerService(), report, sweepIntervalMs, this::announceable);
        if (!connectInterceptor(pulsar.getBrokerInterceptor(), tracker::touched)) {
            log.warn("watermark-cursors: the interceptor of this NAR is not loaded (add watermark-cursors to "
                    + "brokerInterceptors): cursor moves are seen by the sweep only, every {} ms", sweepIntervalMs);
        }
        log.info("watermark-cursors: serving cursor moves at {}/changes (run {}, sweep every {} ms)",
                BASE_PATH, report.epoch(), sweepIntervalMs);
    }

    /** A data topic a generator may follow: persistent, not a system topic, not in the watermark namespace. */
    private boolean announceable(String topic) {
        if (!topic.startsWith("persistent://")) {
            return false;
        }
        TopicName name = TopicName.get(topic);
        return !name.getLocalName().startsWith("__") && !name.getNamespace().equals(watermarkNamespace)
                && !name.getNamespace().startsWith("pulsar/");
    }

    @SuppressWarnings("unchecked")
    private static boolean connectInterceptor(BrokerInterceptor interceptor, Consumer<String> listener) {
        if (!(interceptor instanceof BrokerInterceptors all)) {
            return false;
        }
        boolean connected = false;
        for (BrokerInterceptorWithClassLoader loaded : all.getInterceptors().values()) {
            if (loaded.getInterceptor() instanceof Consumer<?> ours
                    && loaded.getInterceptor().getClass().getName().equals(CursorInterceptor.class.getName())) {
                ((Consumer<Consumer<String>>) ours).accept(listener);
                connected = true;
            }
        }
        return connected;
    }

    @Override
    public String getBasePath() {
        return BASE_PATH;
    }

    @Override
    public ServletHolder getServletHolder() {
        ServletHolder holder = new ServletHolder(this);
        holder.setAsyncSupported(true);
        return holder;
    }

    @Override
    public void close() {
        if (tracker != null) {
            tracker.close();
        }
    }

    @Override
    protected void doGet(HttpServletRequest request, HttpServletResponse response) throws IOException {
        if (!allowed(request, response)) {
            return;
        }
        String epoch = request.getParameter("epoch") == null ? "" : request.getParameter("epoch");
        long since;
        long timeoutMs;
        Predicate<String> wanted;
        try {
            wanted = Namespaces.parse(request.getParameter("namespaces"));
            since = Long.parseLong(request.getParameter("since") == null ? "-1" : request.getParameter("since"));
            timeoutMs = Math.min(MAX_WAIT_MS, Math.max(0, Long.parseLong(
                    request.getParameter("timeoutMs") == null ? "0" : request.getParameter("timeoutMs"))));
        } catch (NumberFormatException e) {
            response.sendError(HttpServletResponse.SC_BAD_REQUEST, "since and timeoutMs must be integers");
            return;
        } catch (IllegalArgumentException e) {
            response.sendError(HttpServletResponse.SC_BAD_REQUEST, "namespaces: " + e.getMessage());
            return;
        }
        Changes changes = report.since(epoch, since, wanted);
        if (!changes.isEmpty() || timeoutMs == 0) {
            write(response, changes);
        } else if (request.isAsyncSupported()) {
            AsyncContext context = request.startAsync();
            context.setTimeout(timeoutMs);
            Waiter waiter = new Waiter(context, epoch, since, wanted, new AtomicBoolean());
            context.addListener(new AsyncListener() {
                @Override
                public void onTimeout(AsyncEvent event) throws IOException {
                    answer(waiter, report.since(waiter.epoch(), waiter.since(), waiter.wanted()));
                }

                @Override
                public void onComplete(AsyncEvent event) {}

                @Override
                public void onError(AsyncEvent event) {
                    waiter.done().set(true);
                    waiters.remove(waiter);
                }

                @Override
                public void onStartAsync(AsyncEvent event) {}
            });
            waiters.add(waiter);
            wakeWaiters(); // a change between since() and add() must not wait for the next one
        } else {
            try {
                write(response, report.await(epoch, since, wanted, timeoutMs));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                response.sendError(HttpServletResponse.SC_SERVICE_UNAVAILABLE);
            }
        }
    }

    private void wakeWaiters() {
        for (Waiter waiter : waiters) {
            Changes changes = report.since(waiter.epoch(), waiter.since(), waiter.wanted());
            if (!changes.isEmpty()) {
                try {
                    answer(waiter, changes);
                } catch (IOException | RuntimeException e) {
                    log.debug("watermark-cursors: answering a waiting generator failed", e);
                }
            }
        }
    }

    private void answer(Waiter waiter, Changes changes) throws IOException {
        if (waiter.done().compareAndSet(false, true)) {
            waiters.remove(waiter);
            write((HttpServletResponse) waiter.context().getResponse(), changes);
            waiter.context().complete();
        }
    }

    private static void write(HttpServletResponse response, Changes changes) throws IOException {
        byte[] body = ChangesJson.render(changes).getBytes(StandardCharsets.UTF_8);
        response.setStatus(HttpServletResponse.SC_OK);
        response.setContentType("application/json");
        response.setContentLength(body.length);
        response.getOutputStream().write(body);
        response.flushBuffer();
    }

    private boolean allowed(HttpServletRequest request, HttpServletResponse response) throws IOException {
        ServiceConfiguration config = pulsar.getConfiguration();
        String role = (String) request.getAttribute(AuthenticationFilter.AuthenticatedRoleAttributeName);
        AuthenticationDataSource data =
                (AuthenticationDataSource) request.getAttribute(AuthenticationFilter.AuthenticatedDataAttributeName);
        AuthorizationService authorization = pulsar.getBrokerService().getAuthorizationService();
        TopicName watermarks = TopicName.get("persistent://" + watermarkNamespace + "/__watermark_cursors");
        Access.Verdict verdict = Access.decide(config.isAuthenticationEnabled(), config.isAuthorizationEnabled(), role,
                () -> ask(() -> authorization.isSuperUser(role, data).get(10, TimeUnit.SECONDS)),
                () -> ask(() -> authorization.canProduce(watermarks, role, data)));
        switch (verdict) {
            case ALLOWED -> {
                return true;
            }
            case UNAUTHENTICATED -> response.sendError(HttpServletResponse.SC_UNAUTHORIZED,
                    "authenticate as the watermark generator's role");
            default -> response.sendError(HttpServletResponse.SC_FORBIDDEN, "role " + role + " may not read cursor "
                    + "positions: only super-users and a role that may produce to " + watermarkNamespace + " may");
        }
        return false;
    }

    private interface Check {
        Boolean run() throws Exception;
    }

    private static boolean ask(Check check) {
        try {
            return Boolean.TRUE.equals(check.run());
        } catch (Exception e) {
            log.warn("watermark-cursors: an authorization check failed; refusing", e);
            return false;
        }
    }
}
