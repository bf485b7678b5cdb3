package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

class AccessTest {
    private static final java.util.function.BooleanSupplier YES = () -> true;
    private static final java.util.function.BooleanSupplier NO = () -> false;

    @Test
    void anOpenBrokerLetsEveryoneRead() {
        assertEquals(Access.Verdict.ALLOWED, Access.decide(false, false, null, NO, NO));
    }

    @Test
    void anonymousCallersAreRefusedWhenTheBrokerAuthenticates() {
        assertEquals(Access.Verdict.UNAUTHENTICATED, Access.decide(true, true, null, YES, YES));
    }

    @Test
    void theGeneratorsRoleAndSuperUsersMayReadOthersMayNot() {
        assertEquals(Access.Verdict.ALLOWED, Access.decide(true, true, "generator", NO, YES));
        assertEquals(Access.Verdict.ALLOWED, Access.decide(true, true, "admin", YES, NO));
        assertEquals(Access.Verdict.FORBIDDEN, Access.decide(true, true, "client", NO, NO));
    }

    @Test
    void authenticationWithoutAuthorizationLetsAnyAuthenticatedRoleRead() {
        assertEquals(Access.Verdict.ALLOWED, Access.decide(true, false, "client", NO, NO));
    }
}
