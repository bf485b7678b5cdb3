package org.pulsarwatermarks.cursors;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

class AdminRequestsTest {
    @Test
    void aTopicsAdminCallMovesOnlyThatTopic() {
        assertEquals(new AdminRequests.Touched("persistent://acme/orders/clicks"),
                AdminRequests.touched("POST", "/admin/v2/persistent/acme/orders/clicks/subscription/app/resetcursor/0"));
        assertEquals(new AdminRequests.Touched("persistent://acme/orders/clicks-partition-2"),
                AdminRequests.touched("DELETE", "/admin/v2/persistent/acme/orders/clicks-partition-2"));
        assertEquals(new AdminRequests.Touched("persistent://acme/orders/a b"),
                AdminRequests.touched("PUT", "/admin/v2/persistent/acme/orders/a%20b/unload"));
    }

    @Test
    void theGeneratorsOwnCallsOnCompanionTopicsAreStillNamedNotSwept() {
        // compaction of a companion topic: one topic looked at (it has no cursors to report), not every topic
        assertEquals(new AdminRequests.Touched("persistent://acme/__watermarks/x"),
                AdminRequests.touched("PUT", "/admin/v2/persistent/acme/__watermarks/x/compaction"));
    }

    @Test
    void aNamespaceOrOlderStyleCallMayMoveAnyTopic() {
        assertEquals(AdminRequests.Touched.EVERY_TOPIC,
                AdminRequests.touched("POST", "/admin/v2/namespaces/acme/orders/unload"));
        assertEquals(AdminRequests.Touched.EVERY_TOPIC,
                AdminRequests.touched("POST", "/admin/persistent/acme/standalone/orders/clicks/skip_all"));
    }

    @Test
    void readsAndOtherKindsOfTopicMoveNothing() {
        assertEquals(null, AdminRequests.touched("GET", "/admin/v2/persistent/acme/orders/clicks/internalStats"));
        assertEquals(null, AdminRequests.touched("PUT", "/admin/v2/non-persistent/acme/orders/clicks"));
        assertEquals(null, AdminRequests.touched("POST", "/lookup/v2/topic/persistent/acme/orders/clicks"));
        assertEquals(null, AdminRequests.touched("POST", null));
    }
}
