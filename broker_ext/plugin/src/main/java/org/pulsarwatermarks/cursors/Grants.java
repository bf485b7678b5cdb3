package org.pulsarwatermarks.cursors;

import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Function;
import java.util.function.LongSupplier;
import java.util.function.Predicate;

/**
 * The broker's answer to "may this role do it in that namespace?" (consume, for what the plugin tells), remembered
 * per (role, namespace) for {@code ttlMs}: a long poll, answered at every cursor move, does not ask the metadata
 * store each time, and a revoked grant counts within {@code ttlMs}. An answer the broker could not give (a
 * timeout, an error) refuses and is not remembered. Thread-safe; the broker's side is the {@link Check}.
 *
 * @param <A> what the broker's check takes besides the role (its authentication data), passed through untouched
 */
public final class Grants<A> {
    /** Asks the broker; may block; throws when it cannot tell. */
    public interface Check<A> {
        boolean allowed(String role, String namespace, A authentication) throws Exception;
    }

    private record Key(String role, String namespace) {}

    private record Verdict(boolean allowed, long until) {}

    private final Check<A> check;
    private final LongSupplier clockMs;
    private final long ttlMs;
    private final int maxRemembered;
    private final Map<Key, Verdict> verdicts = new ConcurrentHashMap<>();

    public Grants(Check<A> check, LongSupplier clockMs, long ttlMs, int maxRemembered) {
        this.check = check;
        this.clockMs = clockMs;
        this.ttlMs = ttlMs;
        this.maxRemembered = maxRemembered;
    }

    /** Whether {@code role} may, asking the broker when no fresh verdict is remembered (may block). */
    public boolean allowed(String role, String namespace, A authentication) {
        Boolean known = known(role, namespace);
        if (known != null) {
            return known;
        }
        boolean allowed;
        try {
            allowed = check.allowed(role, namespace, authentication);
        } catch (Exception e) {
            return false; // not remembered: asked again next time
        }
        if (verdicts.size() >= maxRemembered) {
            forgetStale();
        }
        verdicts.put(new Key(role, namespace), new Verdict(allowed, clockMs.getAsLong() + ttlMs));
        return allowed;
    }

    /** The remembered verdict while fresh, else null (the broker must be asked). Never blocks. */
    public Boolean known(String role, String namespace) {
        Verdict verdict = verdicts.get(new Key(role, namespace));
        return verdict == null || verdict.until() <= clockMs.getAsLong() ? null : verdict.allowed();
    }

    /** The first of {@code namespaces} that {@code role} may not, or null when it may in each. */
    public String firstRefused(String role, Collection<String> namespaces, A authentication) {
        for (String namespace : namespaces) {
            if (!allowed(role, namespace, authentication)) {
                return namespace;
            }
        }
        return null;
    }

    /**
     * {@code query(filter)} where {@code filter} keeps the topics {@code wanted} in namespaces {@code role} may.
     * The query may hold a lock while it filters (the report's), so the filter never asks the broker: a
     * namespace without a fresh verdict is left out, asked after the query, and the query runs again, until
     * every namespace it met had a verdict. So no topic is left out of an answer, and out of its sequence
     * number, for want of one.
     */
    public Changes visible(
            String role, A authentication, Predicate<String> wanted, Function<Predicate<String>, Changes> query) {
        Map<String, Boolean> decided = new HashMap<>(); // one verdict per namespace for the whole answer
        while (true) {
            Set<String> unknown = new HashSet<>();
            Changes changes = query.apply(topic -> {
                if (!wanted.test(topic)) {
                    return false;
                }
                String namespace = Namespaces.namespaceOf(topic);
                if (namespace == null) {
                    return false;
                }
                Boolean allowed = decided.get(namespace);
                if (allowed == null) {
                    allowed = known(role, namespace);
                    if (allowed == null) {
                        unknown.add(namespace);
                        return false;
                    }
                    decided.put(namespace, allowed);
                }
                return allowed;
            });
            if (unknown.isEmpty()) {
                return changes;
            }
            for (String namespace : unknown) {
                decided.put(namespace, allowed(role, namespace, authentication));
            }
        }
    }

    int size() {
        return verdicts.size();
    }

    private void forgetStale() {
        long now = clockMs.getAsLong();
        verdicts.values().removeIf(verdict -> verdict.until() <= now);
        if (verdicts.size() >= maxRemembered) {
            verdicts.clear(); // as many fresh verdicts as that: roles or namespaces come and go; ask again
        }
    }
}
