package org.pulsarwatermarks.cursors;

import java.util.function.BooleanSupplier;

/**
 * Who may read the cursors: the generator's role and super-users, nobody else.
 *
 * <p>The broker authenticates a plugin servlet's requests but does not authorize them, so this does.
 * The generator's least-privilege role is the only one but super-users that may write to the
 * watermark namespace (only the generator may publish watermarks), so that permission is the test:
 * an application role, which may consume the data topics and read the watermark namespace, is refused.
 */
public final class Access {
    public enum Verdict { ALLOWED, UNAUTHENTICATED, FORBIDDEN }

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
            return Verdict.ALLOWED; // a broker open to everyone: its admin API tells the same positions
        }
        if (role == null) {
            return Verdict.UNAUTHENTICATED;
        }
        if (!authorizationEnabled || superUser.getAsBoolean() || mayWriteWatermarks.getAsBoolean()) {
            return Verdict.ALLOWED;
        }
        return Verdict.FORBIDDEN;
    }
}
