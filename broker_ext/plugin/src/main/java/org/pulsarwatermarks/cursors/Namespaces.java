package org.pulsarwatermarks.cursors;

import java.util.Set;
import java.util.function.Predicate;

/**
 * The topics a generator follows, from the {@code namespaces} parameter of its long poll ("tenant/ns,..."):
 * it is told of those only, and its poll is not woken by moves elsewhere (several generators, each following
 * its own namespaces, share a broker at the cost of their own topics). No parameter: every topic.
 */
public final class Namespaces {
    private static final String PERSISTENT = "persistent://";

    private Namespaces() {}

    public static Predicate<String> parse(String parameter) {
        return wanted(names(parameter));
    }

    /** The namespaces the parameter names, in its order; empty: every namespace. */
    public static Set<String> names(String parameter) {
        Set<String> wanted = new java.util.LinkedHashSet<>();
        if (parameter == null || parameter.isBlank()) {
            return wanted;
        }
        for (String namespace : parameter.split(",")) {
            String name = namespace.strip();
            int slash = name.indexOf('/');
            if (slash <= 0 || slash == name.length() - 1 || name.indexOf('/', slash + 1) >= 0) {
                throw new IllegalArgumentException("not a namespace (tenant/namespace): " + name);
            }
            wanted.add(name);
        }
        return wanted;
    }

    /** The topics of {@code names} (empty: every topic). */
    public static Predicate<String> wanted(Set<String> names) {
        return names.isEmpty() ? topic -> true : topic -> names.contains(namespaceOf(topic));
    }

    /** "tenant/ns" of "persistent://tenant/ns/local", null for anything else. */
    static String namespaceOf(String topic) {
        if (!topic.startsWith(PERSISTENT)) {
            return null;
        }
        int tenantEnd = topic.indexOf('/', PERSISTENT.length());
        int namespaceEnd = tenantEnd < 0 ? -1 : topic.indexOf('/', tenantEnd + 1);
        return namespaceEnd < 0 ? null : topic.substring(PERSISTENT.length(), namespaceEnd);
    }
}
