package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

class AccessTest {
    private static final java.util.function.BooleanSupplier YES = () -> true;
    private static final java.util.function.BooleanSupplier NO = () -> false;

    @Test
    void anOpenBrokerLetsEveryoneReadEveryNamespace() {
        assertEquals(Access.Verdict.EVERY_NAMESPACE, Access.decide(false, false, null, NO, NO));
    }

    @Test
    void anonymousCallersAreRefusedWhenTheBrokerAuthenticates() {
        assertEquals(Access.Verdict.UNAUTHENTICATED, Access.decide(true, true, null, YES, YES));
    }

    @Test
    void superUsersReadEveryNamespaceTheGeneratorsRoleThoseItMayConsumeOthersNothing() {
        assertEquals(Access.Verdict.EVERY_NAMESPACE, Access.decide(true, true, "admin", YES, NO));
        assertEquals(Access.Verdict.NAMESPACES_IT_MAY_CONSUME, Access.decide(true, true, "generator", NO, YES));
        assertEquals(Access.Verdict.FORBIDDEN, Access.decide(true, true, "client", NO, NO));
    }

    @Test
    void authenticationWithoutAuthorizationLetsAnyAuthenticatedRoleReadEveryNamespace() {
        assertEquals(Access.Verdict.EVERY_NAMESPACE, Access.decide(true, false, "client", NO, NO));
    }
}
