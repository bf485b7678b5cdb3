package org.pulsarwatermarks.cursors;

import java.util.function.BooleanSupplier;

/**
 * Who may read the cursors, and of which namespaces: super-users every namespace, the generator's role those
 * where it may consume ({@link Grants}), nobody else anything.
 *
 * <p>The broker authenticates a plugin servlet's requests but does not authorize them, so this does.
 * The generator's least-privilege role is the only one but super-users that may write to the
 * watermark namespace (only the generator may publish watermarks), so that permission is the door:
 * an application role, which may consume the data topics and read the watermark namespace, is refused.
 * Past the door a role is told only of the namespaces where it may consume, as it would be through the
 * admin API: it must consume there anyway to follow them.
 */
public final class Access {
    public enum Verdict { EVERY_NAMESPACE, NAMESPACES_IT_MAY_CONSUME, UNAUTHENTICATED, FORBIDDEN }

    private Access() {}

    /**
     * @param authenticationEnabled the broker's {@code authenticationEnabled}
     * @param authorizationEnabled the broker's {@code authorizationEnabled}
     * @param role the authenticated role (null: none)
     * @param superUser whether the role is a super-user (asked only when needed)
     * @param mayWriteWatermarks whether the role may produce to the watermark namespace (asked only when needed)
     */
    public static Verdict decide(
            boolean authenticationEnabled,
            boolean authorizationEnabled,
            String role,
            BooleanSupplier superUser,
            BooleanSupplier mayWriteWatermarks) {
        if (!authenticationEnabled) {
            return Verdict.EVERY_NAMESPACE; // a broker open to everyone: its admin API tells the same positions
        }
        if (role == null) {
            return Verdict.UNAUTHENTICATED;
        }
        if (!authorizationEnabled || superUser.getAsBoolean()) {
            return Verdict.EVERY_NAMESPACE;
        }
        return mayWriteWatermarks.getAsBoolean() ? Verdict.NAMESPACES_IT_MAY_CONSUME : Verdict.FORBIDDEN;
    }
}
