package org.pulsarwatermarks.cursors;

import io.netty.buffer.ByteBuf;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Queue;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
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
import org.apache.bookkeeper.mledger.AsyncCallbacks;
import org.apache.bookkeeper.mledger.ManagedLedger;
import org.apache.bookkeeper.mledger.ManagedLedgerException;
import org.apache.bookkeeper.mledger.Position;
import org.apache.bookkeeper.mledger.PositionFactory;
import org.apache.pulsar.broker.PulsarService;
import org.apache.pulsar.broker.ServiceConfiguration;
import org.apache.pulsar.broker.authentication.AuthenticationDataSource;
import org.apache.pulsar.broker.authorization.AuthorizationService;
import org.apache.pulsar.broker.intercept.BrokerInterceptor;
import org.apache.pulsar.broker.intercept.BrokerInterceptorWithClassLoader;
import org.apache.pulsar.broker.intercept.BrokerInterceptors;
import org.apache.pulsar.broker.service.Topic;
import org.apache.pulsar.broker.service.persistent.PersistentSubscription;
import org.apache.pulsar.broker.service.persistent.PersistentTopic;
import org.apache.pulsar.broker.web.AuthenticationFilter;
import org.apache.pulsar.broker.web.plugin.servlet.AdditionalServletWithPulsarService;
import org.apache.pulsar.common.api.proto.CommandAck;
import org.apache.pulsar.common.api.proto.CommandSubscribe;
import org.apache.pulsar.common.configuration.PulsarConfiguration;
import org.apache.pulsar.common.naming.NamespaceName;
import org.apache.pulsar.common.naming.TopicName;
import org.apache.pulsar.common.policies.data.NamespaceOperation;
import org.eclipse.jetty.servlet.ServletHolder;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code GET /watermark-cursors/changes?epoch=E&since=N&timeoutMs=T}: the topics whose cursors moved
 * since sequence {@code N} of run {@code E}, answered at once when there are some, else when the
 * first comes or after {@code T} ms (a long poll that holds no Jetty thread while it waits). With
 * {@code intake=1}, also the markers found on each of them and the data between ({@link IntakeTracker}).
 * Wire format and settings: docs/PROTOCOL.md, "The broker plugin".
 *
 * <p>Waiting polls are answered on a thread of the plugin's own ({@code watermark-cursors-answers}), woken once
 * per burst of changes, never on the thread that changed the report (the tracker's) nor on a broker's.
 * Who may read what: {@link Access} at the door, then {@link Grants} per namespace.
 */
public final class CursorServlet extends HttpServlet implements AdditionalServletWithPulsarService {
    static final String BASE_PATH = "/watermark-cursors";
    private static final long MAX_WAIT_MS = 30_000;
    /** How long a verdict of the broker's authorization is trusted: a revoked grant counts within it. */
    private static final long GRANT_TTL_MS = 10_000;
    private static final long CHECK_TIMEOUT_S = 10;
    /** A namespace a generator named in a long poll counts as followed this long after (several polls' time). */
    private static final long FOLLOWED_FOR_MS = 3 * MAX_WAIT_MS;
    private static final int MAX_FRESH_WAITING = 10_000;
    /** How long a follow request waits for its subscriptions and properties before it answers what is done. */
    private static final long FOLLOW_TIMEOUT_S = 30;
    private static final Logger log = LoggerFactory.getLogger(CursorServlet.class);

    private final CursorReport report = new CursorReport();
    private final FreshTopics fresh = new FreshTopics(System::currentTimeMillis, FOLLOWED_FOR_MS, MAX_FRESH_WAITING);
    private final Queue<Waiter> waiters = new ConcurrentLinkedQueue<>();
    private final Map<String, CompletableFuture<String>> settingIncarnation = new ConcurrentHashMap<>();
    private final AtomicBoolean wakeAsked = new AtomicBoolean();
    /** The sequence ids of the snapshot records written here (no deduplication reads them). */
    private final java.util.concurrent.atomic.AtomicLong snapshotSequence = new java.util.concurrent.atomic.AtomicLong();
    private final ScheduledThreadPoolExecutor answers = answerThread();
    private long sweepIntervalMs = 2000;
    private String watermarkNamespace = "public/__watermarks";
    private long intakeMaxItems = IntakeTracker.KEPT_PER_BROKER;
    private PulsarService pulsar;
    private CursorTracker tracker;
    private IntakeTracker intake;
    private Grants<AuthenticationDataSource> consume;
    private Grants<AuthenticationDataSource> produce;

    /** What one request may be told: the report's changes since a sequence number, filtered for its role. */
    private interface View {
        Changes since(String epoch, long since);
    }

    private static final class Waiter {
        final AsyncContext context;
        final String epoch;
        final long since;
        final View view;
        final AtomicBoolean done = new AtomicBoolean();
        volatile ScheduledFuture<?> timeout;

        Waiter(AsyncContext context, String epoch, long since, View view) {
            this.context = context;
            this.epoch = epoch;
            this.since = since;
            this.view = view;
        }

        Changes changes() {
            return view.since(epoch, since);
        }
    }

    private static ScheduledThreadPoolExecutor answerThread() {
        ScheduledThreadPoolExecutor executor = new ScheduledThreadPoolExecutor(1, runnable -> {
            Thread t = new Thread(runnable, "watermark-cursors-answers");
            t.setDaemon(true);
            return t;
        });
        executor.setRemoveOnCancelPolicy(true); // a poll answered early takes its timeout with it
        return executor;
    }

    @Override
    public void loadConfig(PulsarConfiguration config) {
        var properties = config.getProperties();
        sweepIntervalMs = Long.parseLong(properties.getProperty("watermarkCursorsSweepIntervalMs", "2000"));
        watermarkNamespace = properties.getProperty("watermarkNamespace", watermarkNamespace);
        intakeMaxItems = Long.parseLong(properties.getProperty("watermarkIntakeMaxItems",
                String.valueOf(IntakeTracker.KEPT_PER_BROKER)));
    }

    @Override
    public void setPulsarService(PulsarService pulsar) {
        this.pulsar = pulsar;
        AuthorizationService authorization = pulsar.getBrokerService().getAuthorizationService();
        // Pulsar 4.0.7's PulsarAuthorizationProvider lets a namespace's UNSUBSCRIBE to super-users, the tenant's
        // admins and a role granted consume there (or by a wildcard): "may consume in the namespace"
        consume = new Grants<>((role, namespace, data) -> Boolean.TRUE.equals(logged(role, namespace,
                () -> authorization.allowNamespaceOperationAsync(NamespaceName.get(namespace),
                        NamespaceOperation.UNSUBSCRIBE, role, data).get(CHECK_TIMEOUT_S, TimeUnit.SECONDS))),
                System::currentTimeMillis, GRANT_TTL_MS, 10_000);
        produce = new Grants<>((role, namespace, data) -> Boolean.TRUE.equals(logged(role, namespace,
                () -> authorization.canProduce(TopicName.get("persistent://" + namespace + "/__watermark_cursors"),
                        role, data))), System::currentTimeMillis, GRANT_TTL_MS, 10_000);
        report.onChange(this::wakeSoon);
        intake = new IntakeTracker(report, System::currentTimeMillis, intakeMaxItems);
        tracker = new CursorTracker(pulsar.getBrokerService(), report, sweepIntervalMs, this::announceable, fresh,
                intake);
        if (!connectInterceptor(pulsar.getBrokerInterceptor(), tracker.hooks())) {
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
    private static boolean connectInterceptor(BrokerInterceptor interceptor, Map<String, Consumer<String>> hooks) {
        if (!(interceptor instanceof BrokerInterceptors all)) {
            return false;
        }
        boolean connected = false;
        for (BrokerInterceptorWithClassLoader loaded : all.getInterceptors().values()) {
            if (loaded.getInterceptor() instanceof Consumer<?> ours
                    && loaded.getInterceptor().getClass().getName().equals(CursorInterceptor.class.getName())) {
                ((Consumer<Map<String, Consumer<String>>>) ours).accept(hooks);
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
        if (intake != null) {
            intake.close();
        }
        answers.shutdownNow();
    }

    @Override
    protected void doGet(HttpServletRequest request, HttpServletResponse response) throws IOException {
        String epoch = request.getParameter("epoch") == null ? "" : request.getParameter("epoch");
        long since;
        long timeoutMs;
        Set<String> named;
        try {
            named = Namespaces.names(request.getParameter("namespaces"));
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
        boolean withIntake = "1".equals(request.getParameter("intake")) || "true".equals(request.getParameter("intake"));
        View view = view(request, response, named, withIntake ? intake::intakeOf : null);
        if (view == null) {
            return; // refused
        }
        if (withIntake) {
            intake.asked(named); // the followed topics of these namespaces are read for their markers from now on
        }
        fresh.followed(named); // new topics of these namespaces are announced from now on
        Changes changes = view.since(epoch, since);
        if (!changes.isEmpty() || timeoutMs == 0 || !request.isAsyncSupported()) {
            write(response, changes);
            return;
        }
        AsyncContext context = request.startAsync();
        context.setTimeout(timeoutMs + CHECK_TIMEOUT_S * 1000); // a backstop: the answer thread answers at timeoutMs
        Waiter waiter = new Waiter(context, epoch, since, view);
        context.addListener(new AsyncListener() {
            @Override
            public void onTimeout(AsyncEvent event) throws IOException {
                answer(waiter, waiter.changes());
            }

            @Override
            public void onComplete(AsyncEvent event) {}

            @Override
            public void onError(AsyncEvent event) {
                waiter.done.set(true);
                waiters.remove(waiter);
            }

            @Override
            public void onStartAsync(AsyncEvent event) {}
        });
        waiters.add(waiter);
        waiter.timeout = answers.schedule(() -> answerQuietly(waiter, waiter.changes()), timeoutMs,
                TimeUnit.MILLISECONDS);
        wakeSoon(); // a change between since() and add() must not wait for the next one
    }

    /**
     * {@code POST /watermark-cursors/acknowledge}: moves the {@code __wm_generator} cursor of each topic named
     * ({@link Acknowledgements}) that this broker serves, making the subscription where it is missing: the
     * generator's cursor kept inside the broker, with no consumer of the generator's. A role may move it only in
     * namespaces where it may consume. Acknowledgements made here pass no interceptor, so the tracker is told.
     */
    @Override
    protected void doPost(HttpServletRequest request, HttpServletResponse response) throws IOException {
        if ("/follow".equals(request.getPathInfo())) {
            follow(request, response);
            return;
        }
        if ("/snapshots".equals(request.getPathInfo())) {
            writeSnapshots(request, response);
            return;
        }
        if (!"/acknowledge".equals(request.getPathInfo())) {
            response.sendError(HttpServletResponse.SC_NOT_FOUND, "POST " + BASE_PATH + "/acknowledge, " + BASE_PATH
                    + "/follow or " + BASE_PATH + "/snapshots only");
            return;
        }
        Map<String, TopicCursors.Position> wanted = allowedBody(request, response, Acknowledgements::parse);
        if (wanted == null) {
            return;
        }
        Map<String, String> outcomes = new LinkedHashMap<>();
        wanted.forEach((topic, position) -> outcomes.put(topic, acknowledge(topic, position)));
        writeJson(response, Acknowledgements.render(outcomes));
    }

    /**
     * A POST's body, per topic, as {@code parse} reads it, if it is well-formed (else 400 with the line) and the role
     * may consume in every namespace it names (else refused); null once answered so.
     */
    private <T> Map<String, T> allowedBody(HttpServletRequest request, HttpServletResponse response,
            java.util.function.Function<String, Map<String, T>> parse) throws IOException {
        Map<String, T> wanted;
        try {
            wanted = parse.apply(new String(request.getInputStream().readAllBytes(), StandardCharsets.UTF_8));
        } catch (IllegalArgumentException e) {
            response.sendError(HttpServletResponse.SC_BAD_REQUEST, e.getMessage());
            return null;
        }
        Set<String> namespaces = new java.util.LinkedHashSet<>();
        wanted.keySet().forEach(topic -> namespaces.add(Namespaces.namespaceOf(topic)));
        return view(request, response, namespaces, null) == null ? null : wanted; // refused: one it may not consume in
    }

    private String acknowledge(String topic, TopicCursors.Position position) {
        if (!(pulsar.getBrokerService().getTopicReference(topic).orElse(null) instanceof PersistentTopic served)) {
            return Acknowledgements.ELSEWHERE;
        }
        try {
            PersistentSubscription subscription = served.getSubscription(BrokerCursors.GENERATOR_SUBSCRIPTION);
            if (subscription == null) {
                subscription = (PersistentSubscription) served.createSubscription(BrokerCursors.GENERATOR_SUBSCRIPTION,
                        CommandSubscribe.InitialPosition.Earliest, false, Map.of()).get(CHECK_TIMEOUT_S,
                        TimeUnit.SECONDS);
            }
            Position current = subscription.getCursor().getMarkDeletedPosition();
            Position target = PositionFactory.create(position.ledger(), position.entry());
            if (target.compareTo(current) > 0) { // an older position is done already: the cursor never moves back
                subscription.acknowledgeMessage(List.of(target), CommandAck.AckType.Cumulative, Map.of());
            }
            tracker.moved(topic);
            return Acknowledgements.DONE;
        } catch (Exception e) {
            log.warn("watermark-cursors: moving the generator's cursor of {} to {} failed", topic, position, e);
            return "failed: " + e;
        }
    }

    /**
     * {@code POST /watermark-cursors/snapshots} ({@link SnapshotWrites}): the generator's snapshot records written
     * into the data topics this broker serves, with no producer of the generator's: 5000 producers, one per
     * partition, cost a take-over of 5000 fresh topics about as much of the broker's CPU as the rest of the tail after
     * it. Allowed where the role may consume (as the report) and produce (as its producer was).
     */
    private void writeSnapshots(HttpServletRequest request, HttpServletResponse response) throws IOException {
        Map<String, SnapshotWrites.Wanted> wanted = allowedBody(request, response, SnapshotWrites::parse);
        if (wanted == null) {
            return;
        }
        String role = (String) request.getAttribute(AuthenticationFilter.AuthenticatedRoleAttributeName);
        AuthenticationDataSource data =
                (AuthenticationDataSource) request.getAttribute(AuthenticationFilter.AuthenticatedDataAttributeName);
        for (String topic : wanted.keySet()) {
            String namespace = Namespaces.namespaceOf(topic);
            if (!produce.allowed(role, namespace, data)) {
                refuse(response, HttpServletResponse.SC_FORBIDDEN, "role " + role + " may not produce in namespace "
                        + namespace + ", so the plugin does not write its snapshots there: grant it (pulsar-admin "
                        + "namespaces grant-permission " + namespace + " --role " + role + " --actions produce,consume)");
                return;
            }
        }
        Map<String, CompletableFuture<String>> pending = new LinkedHashMap<>();
        wanted.forEach((topic, record) -> pending.put(topic,
                pulsar.getBrokerService().getTopicReference(topic).orElse(null) instanceof PersistentTopic served
                        ? written(served, record) : CompletableFuture.completedFuture(Acknowledgements.ELSEWHERE)));
        try {
            CompletableFuture.allOf(pending.values().toArray(new CompletableFuture<?>[0]))
                    .get(CHECK_TIMEOUT_S, TimeUnit.SECONDS);
        } catch (Exception e) {
            // each topic's own outcome is read below: some may be late
        }
        Map<String, String> outcomes = new LinkedHashMap<>();
        pending.forEach((topic, outcome) -> outcomes.put(topic,
                outcome.getNow("failed: not written within " + CHECK_TIMEOUT_S + " s")));
        writeJson(response, Acknowledgements.render(outcomes));
    }

    /** Appends the record to the topic as Pulsar's replicated-subscriptions controller writes its markers. */
    private CompletableFuture<String> written(PersistentTopic topic, SnapshotWrites.Wanted record) {
        CompletableFuture<String> outcome = new CompletableFuture<>();
        long sequenceId = snapshotSequence.incrementAndGet();
        ByteBuf entry = SnapshotWrites.entry(record, sequenceId, System.currentTimeMillis());
        try {
            topic.publishMessage(entry, new Topic.PublishContext() {
                @Override
                public void completed(Exception e, long ledgerId, long entryId) {
                    outcome.complete(e != null ? "failed: " + e
                            : ledgerId < 0 ? "failed: not written" : SnapshotWrites.written(ledgerId, entryId));
                }

                @Override
                public String getProducerName() {
                    return record.producer();
                }

                @Override
                public long getSequenceId() {
                    return sequenceId;
                }

                @Override
                public boolean isMarkerMessage() {
                    return true; // deduplication lets it by: a snapshot written twice is harmless
                }
            });
        } catch (RuntimeException e) {
            outcome.complete("failed: " + e);
        } finally {
            entry.release(); // the managed ledger holds its own reference while it writes
        }
        return outcome;
    }

    /**
     * {@code POST /watermark-cursors/follow} ({@link Follows}): a generator taking over topics has the plugin make
     * each one's {@code __wm_generator} subscription and set its incarnation property where unset, all at once,
     * instead of two admin calls per topic (1000 partitions took 8 s of admin calls). Allowed where it may consume,
     * as the subscription is: the property is only ever set where unset, and every generator adopts the one in place.
     */
    private void follow(HttpServletRequest request, HttpServletResponse response) throws IOException {
        Map<String, String> wanted = allowedBody(request, response, Follows::parse);
        if (wanted == null) {
            return;
        }
        Map<String, CompletableFuture<String>> pending = new LinkedHashMap<>();
        List<String> elsewhere = new ArrayList<>();
        wanted.forEach((topic, token) -> {
            if (pulsar.getBrokerService().getTopicReference(topic).orElse(null) instanceof PersistentTopic served) {
                pending.put(topic, followed(served, token));
            } else {
                elsewhere.add(topic);
            }
        });
        try {
            CompletableFuture.allOf(pending.values().toArray(new CompletableFuture<?>[0]))
                    .get(FOLLOW_TIMEOUT_S, TimeUnit.SECONDS);
        } catch (Exception e) {
            // each topic's own outcome is read below: some may have failed or be late
        }
        Map<String, String> incarnations = new LinkedHashMap<>();
        Map<String, String> failed = new LinkedHashMap<>();
        pending.forEach((topic, outcome) -> {
            if (outcome.isDone() && !outcome.isCompletedExceptionally()) {
                incarnations.put(topic, outcome.join());
                tracker.moved(topic); // reported from now on: the subscription exists
            } else {
                String why = outcome.isDone() ? outcome.handle((ok, e) -> String.valueOf(e)).join()
                        : "not done within " + FOLLOW_TIMEOUT_S + " s";
                log.warn("watermark-cursors: following {} failed: {}", topic, why);
                failed.put(topic, why);
            }
        });
        writeJson(response, Follows.render(incarnations, elsewhere, failed));
    }

    /** The topic's generator subscription made, then the incarnation token in place (ours where it was unset). */
    private CompletableFuture<String> followed(PersistentTopic topic, String token) {
        CompletableFuture<?> subscribed = topic.getSubscription(BrokerCursors.GENERATOR_SUBSCRIPTION) != null
                ? CompletableFuture.completedFuture(null)
                : topic.createSubscription(BrokerCursors.GENERATOR_SUBSCRIPTION,
                        CommandSubscribe.InitialPosition.Earliest, false, Map.of());
        return subscribed.thenCompose(made -> incarnation(topic.getManagedLedger(), token));
    }

    /**
     * Sets the property where unset. One setting per topic at a time: a request that comes while another sets it
     * shares that setting, and the one that sets reads the property again first, so every request is told the one
     * token the topic keeps (two generators starting together ask for the same topics at once).
     */
    private CompletableFuture<String> incarnation(ManagedLedger ledger, String token) {
        String inPlace = ledger.getProperties().get(Follows.INCARNATION_PROPERTY);
        if (inPlace != null) {
            return CompletableFuture.completedFuture(inPlace);
        }
        String name = ledger.getName();
        CompletableFuture<String> mine = new CompletableFuture<>();
        CompletableFuture<String> running = settingIncarnation.putIfAbsent(name, mine);
        if (running != null) {
            return running;
        }
        mine.whenComplete((value, e) -> settingIncarnation.remove(name, mine));
        inPlace = ledger.getProperties().get(Follows.INCARNATION_PROPERTY); // set by the one before us meanwhile?
        if (inPlace != null) {
            mine.complete(inPlace);
            return mine;
        }
        ledger.asyncSetProperty(Follows.INCARNATION_PROPERTY, token, new AsyncCallbacks.UpdatePropertiesCallback() {
            @Override
            public void updatePropertiesComplete(Map<String, String> properties, Object ctx) {
                mine.complete(properties.getOrDefault(Follows.INCARNATION_PROPERTY, token));
            }

            @Override
            public void updatePropertiesFailed(ManagedLedgerException e, Object ctx) {
                mine.completeExceptionally(e);
            }
        }, null);
        return mine;
    }

    /** Any thread: have the answer thread look at every waiting poll, once for a burst of changes. */
    private void wakeSoon() {
        if (wakeAsked.compareAndSet(false, true)) {
            try {
                answers.execute(this::wakeWaiters);
            } catch (java.util.concurrent.RejectedExecutionException e) {
                // closing
            }
        }
    }

    private void wakeWaiters() {
        wakeAsked.set(false); // before looking: a change from now on asks for another look
        for (Waiter waiter : waiters) {
            try {
                Changes changes = waiter.changes();
                if (!changes.isEmpty()) {
                    answerQuietly(waiter, changes);
                }
            } catch (RuntimeException e) {
                log.warn("watermark-cursors: looking at a waiting poll failed; its timeout answers it", e);
            }
        }
    }

    private void answerQuietly(Waiter waiter, Changes changes) {
        try {
            answer(waiter, changes);
        } catch (IOException | RuntimeException e) {
            log.debug("watermark-cursors: answering a waiting generator failed", e);
        }
    }

    private void answer(Waiter waiter, Changes changes) throws IOException {
        if (waiter.done.compareAndSet(false, true)) {
            waiters.remove(waiter);
            ScheduledFuture<?> timeout = waiter.timeout;
            if (timeout != null) {
                timeout.cancel(false);
            }
            write((HttpServletResponse) waiter.context.getResponse(), changes);
            waiter.context.complete();
        }
    }

    private static void write(HttpServletResponse response, Changes changes) throws IOException {
        writeJson(response, ChangesJson.render(changes));
    }

    private static void writeJson(HttpServletResponse response, String json) throws IOException {
        byte[] body = json.getBytes(StandardCharsets.UTF_8);
        response.setStatus(HttpServletResponse.SC_OK);
        response.setContentType("application/json");
        response.setContentLength(body.length);
        response.getOutputStream().write(body);
        response.flushBuffer();
    }

    /** What the request's role may be told of the namespaces it named (none: every one), or null once refused. */
    private View view(HttpServletRequest request, HttpServletResponse response, Set<String> named,
            java.util.function.Function<String, TopicIntake> intakes) throws IOException {
        ServiceConfiguration config = pulsar.getConfiguration();
        String role = (String) request.getAttribute(AuthenticationFilter.AuthenticatedRoleAttributeName);
        AuthenticationDataSource data =
                (AuthenticationDataSource) request.getAttribute(AuthenticationFilter.AuthenticatedDataAttributeName);
        AuthorizationService authorization = pulsar.getBrokerService().getAuthorizationService();
        Access.Verdict verdict = Access.decide(config.isAuthenticationEnabled(), config.isAuthorizationEnabled(), role,
                () -> ask(() -> authorization.isSuperUser(role, data).get(CHECK_TIMEOUT_S, TimeUnit.SECONDS)),
                () -> produce.allowed(role, watermarkNamespace, data));
        Predicate<String> wanted = Namespaces.wanted(named);
        switch (verdict) {
            case EVERY_NAMESPACE -> {
                return (epoch, since) -> report.since(epoch, since, wanted, intakes);
            }
            case NAMESPACES_IT_MAY_CONSUME -> {
                String refused = consume.firstRefused(role, named, data);
                if (refused == null) {
                    return named.isEmpty()
                            ? (epoch, since) -> consume.visible(role, data, wanted,
                                    allowed -> report.since(epoch, since, allowed, intakes))
                            : (epoch, since) -> report.since(epoch, since, wanted, intakes); // each checked just now
                }
                refuse(response, HttpServletResponse.SC_FORBIDDEN, "role " + role + " may not consume in namespace "
                        + refused + ", so the plugin does not tell it of that namespace's topics: grant it "
                        + "(pulsar-admin namespaces grant-permission " + refused + " --role " + role
                        + " --actions produce,consume) or leave " + refused + " out of the namespaces it follows");
            }
            case UNAUTHENTICATED -> refuse(response, HttpServletResponse.SC_UNAUTHORIZED,
                    "authenticate as the watermark generator's role");
            default -> refuse(response, HttpServletResponse.SC_FORBIDDEN, "role " + role + " may not read cursor "
                    + "positions: only super-users and a role that may produce to " + watermarkNamespace + " may");
        }
        return null;
    }

    /** A refusal the generator's log can quote: one line of plain text. */
    private static void refuse(HttpServletResponse response, int status, String why) throws IOException {
        byte[] body = (why + "\n").getBytes(StandardCharsets.UTF_8);
        response.setStatus(status);
        response.setContentType("text/plain; charset=utf-8");
        response.setContentLength(body.length);
        response.getOutputStream().write(body);
        response.flushBuffer();
    }

    private interface Check {
        Boolean run() throws Exception;
    }

    /** The broker's answer; a failure is logged, then thrown (the verdict is then not remembered). */
    private static Boolean logged(String role, String namespace, Check check) throws Exception {
        try {
            return check.run();
        } catch (Exception e) {
            log.warn("watermark-cursors: checking what role {} may do in {} failed; refusing", role, namespace, e);
            throw e;
        }
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
