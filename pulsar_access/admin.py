"""A small client of the Pulsar admin REST API (v2): only the calls this project needs.

Errors name the fix: an admin URL that does not answer, a topic that does not exist, a credential
that is refused each raise `AdminError` with one line saying what to do.
"""

from __future__ import annotations

import base64
import http.client
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urljoin, urlsplit

import orjson
import requests

from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import TopicName
from watermark_core.protocol import INTERNAL_SUBSCRIPTIONS

T = TypeVar("T")


class AdminError(RuntimeError):
    """An admin API call failed; the message says what to do about it."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BrokerUnreachable(AdminError):
    """No answer from a broker's admin URL (refused, reset, timed out)."""


class TopicNotFound(AdminError):
    """The topic (or its subscription) does not exist."""


class PluginMissing(AdminError):
    """The broker does not serve the watermark-cursors plugin (a broker without it answers 404)."""


@dataclass(frozen=True)
class PluginFollowed:
    """A plugin's answer to `plugin_follow`: per topic the incarnation token in place, or another broker serves
    it, or why it failed."""

    incarnations: dict[str, str]
    elsewhere: list[str]
    failed: dict[str, str]


PLUGIN_CHANGES_PATH = "/watermark-cursors/changes"
PLUGIN_ACKNOWLEDGE_PATH = "/watermark-cursors/acknowledge"
PLUGIN_FOLLOW_PATH = "/watermark-cursors/follow"
PLUGIN_SNAPSHOTS_PATH = "/watermark-cursors/snapshots"
PLUGIN_FOLLOW_TIMEOUT_S = 40.0
"""The plugin answers a follow request within 30 s, with what is done by then (its FOLLOW_TIMEOUT_S)."""


class PulsarAdmin:
    """Admin API calls over one HTTP session."""

    def __init__(self, settings: PulsarSettings | None = None, timeout_s: float = 10.0) -> None:
        self.settings = settings or PulsarSettings.from_env()
        self.timeout_s = timeout_s
        self._bases = admin_urls(self.settings.admin_url)
        self._base = 0
        """Index of the admin URL in use: the next one is tried when a broker does not answer."""
        self._http = requests.Session()
        # one session serves every partition worker's thread
        self._http.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=64))
        self._http.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=64))
        self._http.headers.update(self.settings.admin_headers())
        self._owners: dict[str, str] = {}
        """Topic path -> the admin URL of the broker that answered for it last (skips the redirect next time)."""
        self._local = threading.local()
        self._fast_connections: list[http.client.HTTPConnection] = []
        self._fast_lock = threading.Lock()

    def close(self) -> None:
        self._http.close()
        with self._fast_lock:
            connections, self._fast_connections = self._fast_connections, []
        for connection in connections:
            connection.close()

    @property
    def admin_bases(self) -> list[str]:
        """Every admin URL configured (`PULSAR_ADMIN_URL` may list several brokers)."""
        return list(self._bases)

    @property
    def base_url(self) -> str:
        """The admin URL calls go to first (a topic's calls are redirected on to its owner)."""
        return self._bases[self._base]

    def _next_base(self, failed: str) -> None:
        """A broker of the list did not answer: the next calls start at the next one."""
        with self._fast_lock:
            if self._bases[self._base] == failed:
                self._base = (self._base + 1) % len(self._bases)

    def _connection(self, origin: str) -> http.client.HTTPConnection:
        """This thread's keep-alive connection to `origin` (scheme://host:port) for `_get`: a stats call costs a
        quarter of one through requests. One per broker: a topic's calls go to the broker that owns it."""
        connections: dict[str, http.client.HTTPConnection] | None = getattr(self._local, "connections", None)
        if connections is None:
            connections = self._local.connections = {}
        connection = connections.get(origin)
        if connection is None:
            url = urlsplit(origin)
            kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
            connection = kind(url.hostname or "127.0.0.1", url.port, timeout=self.timeout_s)
            connections[origin] = connection
            with self._fast_lock:
                self._fast_connections.append(connection)
        return connection

    def _keep_alive_get(
        self, origin: str, target: str, headers: dict[str, str]
    ) -> tuple[http.client.HTTPResponse, bytes]:
        """GET `target` on this thread's keep-alive connection to `origin`, once more on a connection the server
        had closed; the second failure (or a timeout) is raised as the client raised it."""
        for attempt in (1, 2):
            connection = self._connection(origin)
            try:
                connection.request("GET", target, headers=headers)
                response = connection.getresponse()
                return response, response.read()
            except (http.client.HTTPException, OSError) as exc:
                connection.close()
                if attempt == 2 or isinstance(exc, TimeoutError):
                    raise
        raise AssertionError("not reached: the second attempt returns or raises")

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        return self._on_any_broker(lambda: self._get_once(path, params))

    def _call(self, method: str, path: str, *, api: str = "admin/v2", **kwargs: Any) -> Any:
        return self._on_any_broker(lambda: self._call_once(method, path, api, **kwargs))

    def _on_any_broker(self, call: Callable[[], T]) -> T:
        """`call()`, once more on each further admin URL of the list while the one in use does not answer."""
        for _ in range(len(self._bases) - 1):
            try:
                return call()
            except BrokerUnreachable:
                continue
        return call()

    def _get_once(self, path: str, params: dict[str, str] | None = None) -> Any:
        """GET a JSON document on a plain keep-alive connection of this thread; errors as `_call` raises them.

        For the generator's frequent stats calls; one retry on a connection the server closed. A broker
        that does not own the topic answers 307 with the owner's URL: followed (as Pulsar's own admin
        client does), with the same credentials.
        """
        query = f"?{urlencode(params)}" if params else ""
        headers = {"Accept": "application/json", **self.settings.admin_headers()}
        base = self.base_url
        owner_key = _topic_key(path)
        start = self._owners.get(owner_key, base) if owner_key else base
        url = f"{start}/admin/v2/{path}{query}"
        for _hop in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            origin = f"{parts.scheme}://{parts.netloc}"
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            try:
                response, body = self._keep_alive_get(origin, target, headers)
            except (http.client.HTTPException, OSError) as exc:
                self._owners.pop(owner_key, None)  # a broker gone: ask the list again next time
                if origin == _origin(base):
                    self._next_base(base)
                raise BrokerUnreachable(
                    f"Pulsar admin API at {origin} does not answer ({type(exc).__name__}); "
                    "start the cluster with 'make cluster-up' or set PULSAR_ADMIN_URL"
                ) from exc
            location = response.getheader("Location")
            if response.status not in REDIRECTS or not location:
                break
            url = urljoin(url, location)
        else:
            raise AdminError(f"Pulsar admin API GET {path}: more than {MAX_REDIRECTS} redirects (last to {url})")
        if owner_key and response.status < 400:
            self._owners[owner_key] = url.split("/admin/v2/", 1)[0]
        text = body.decode("utf-8", errors="replace")
        if response.status == 404:
            raise TopicNotFound(f"not found: {path} ({text.strip()[:200]})", 404)
        if response.status in (401, 403):
            raise AdminError(self._refused_text("GET", path, response.status, text), response.status)
        if response.status >= 400:
            raise AdminError(
                f"Pulsar admin API GET {path} failed with {response.status}: {text.strip()[:300]}", response.status
            )
        # orjson: the generator's sweep decodes every owned topic's stats each second (4x the stdlib's speed)
        return orjson.loads(body) if body else None

    def _call_once(self, method: str, path: str, api: str, **kwargs: Any) -> Any:
        """One admin call through requests; redirects to the topic's owner followed with the method, body and
        credentials kept (requests would drop the Authorization header on a redirect to another port)."""
        base = self.base_url
        params = kwargs.pop("params", None)
        url = f"{base}/{api}/{path}" + (f"?{urlencode(params)}" if params else "")
        for _hop in range(MAX_REDIRECTS + 1):
            try:  # the Location of a redirect is the whole next URL: a leader may drop a parameter it handled
                response = self._http.request(method, url, timeout=self.timeout_s, allow_redirects=False, **kwargs)
            except requests.ConnectionError as exc:
                if url.startswith(base):
                    self._next_base(base)
                raise BrokerUnreachable(
                    f"Pulsar admin API at {_origin(url)} does not answer ({type(exc).__name__}); "
                    "start the cluster with 'make cluster-up' or set PULSAR_ADMIN_URL"
                ) from exc
            except requests.Timeout as exc:
                raise AdminError(f"Pulsar admin API at {_origin(url)} timed out on {path}") from exc
            location = response.headers.get("Location")
            if response.status_code not in REDIRECTS or not location:
                break
            url = urljoin(url, location)
        else:
            raise AdminError(f"Pulsar admin API {method} {path}: more than {MAX_REDIRECTS} redirects (last to {url})")
        if response.status_code == 404:
            raise TopicNotFound(f"not found: {path} ({response.text.strip()[:200]})", 404)
        if response.status_code in (401, 403):
            raise AdminError(
                self._refused_text(method, path, response.status_code, response.text), response.status_code
            )
        if response.status_code >= 400:
            raise AdminError(
                f"Pulsar admin API {method} {path} failed with {response.status_code}: {response.text.strip()[:300]}",
                response.status_code,
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text

    def _refused_text(self, method: str, path: str, status: int, text: str) -> str:
        """A 401 or 403 as one line that says what to do about it.

        Pulsar answers 401 both when it cannot authenticate the caller (an HTML page, "Authentication
        required") and when the authenticated role is not authorized (JSON `{"reason": "Unauthorized
        to ... operation [X] ..."}`), sometimes 403 for the latter; the body tells them apart.
        """
        where = f"Pulsar admin API at {self.base_url} refused {method} {path}"
        token = self.settings.auth_token
        operation = _OPERATION.search(text)
        if token is None:
            return (
                f"{where} ({status}: authentication required); set PULSAR_AUTH_TOKEN or "
                "PULSAR_AUTH_TOKEN_FILE (Spark: option authToken) to a token of a role with access; a local cluster "
                "started with 'make cluster-up AUTH=token' writes them to .cluster/auth/"
            )
        if operation is None and "Unauthorized" not in text:
            return (
                f"{where} ({status}: the token in PULSAR_AUTH_TOKEN / PULSAR_AUTH_TOKEN_FILE was not "
                "accepted); use a token signed with this cluster's key ('make cluster-up AUTH=token' writes them "
                "to .cluster/auth/)"
            )
        from pulsar_access.auth_tokens import role_of

        role = role_of(token) or "<role>"
        needed, namespace = required_permission(path, operation.group(1) if operation else None)
        what = f"operation {operation.group(1)}" if operation else f"{method} {path}"
        if namespace is None or needed == "a super user":
            return (
                f"{where} ({status}): role {role!r} is not allowed {what}, which needs a super user; "
                "use a super user's token in PULSAR_AUTH_TOKEN or PULSAR_AUTH_TOKEN_FILE"
            )
        if needed == "tenant admin":
            tenant = namespace.split("/")[0]
            return (
                f"{where} ({status}): role {role!r} is not allowed {what}, which needs an admin of "
                f"tenant {tenant!r} (pulsar-admin tenants update {tenant} --admin-roles {role}) or a super user"
            )
        return (
            f"{where} ({status}): role {role!r} lacks permission {needed} on namespace {namespace} "
            f"({what}); grant it as a super user with 'pulsar-admin namespaces grant-permission {namespace} "
            f"--role {role} --actions produce,consume' (REST: POST /admin/v2/namespaces/{namespace}/permissions/"
            f'{role} with body ["produce", "consume"]), or set PULSAR_AUTH_TOKEN / PULSAR_AUTH_TOKEN_FILE to a '
            "token of a role that has it"
        )

    # -- health and namespaces -------------------------------------------------------------

    def healthy(self) -> bool:
        """True once the broker answers its health check and `public/default` exists."""
        try:
            if self._call("GET", "brokers/health") != "ok":
                return False
            return "public/default" in (self._call("GET", "namespaces/public") or [])
        except AdminError:
            return False

    def create_tenant(self, tenant: str, admin_roles: Sequence[str] = ()) -> None:
        """Create `tenant` on every cluster of this instance unless it exists; needs a super user."""
        body = {"adminRoles": list(admin_roles), "allowedClusters": list(self._call("GET", "clusters") or [])}
        try:
            self._call("PUT", f"tenants/{quote(tenant, safe='')}", json=body)
        except AdminError as exc:
            if exc.status != 409:
                raise

    def create_namespace(self, namespace: str) -> None:
        """Create `tenant/namespace` unless it exists."""
        try:
            self._call("PUT", f"namespaces/{namespace}")
        except AdminError as exc:
            if exc.status != 409:
                raise

    def grant_namespace_permission(self, namespace: str, role: str, actions: Sequence[str]) -> None:
        """Grant `role` the namespace permissions `actions` (produce, consume, ...); needs a super user."""
        self._call("POST", f"namespaces/{namespace}/permissions/{quote(role, safe='')}", json=list(actions))

    def grant_topic_permission(self, topic: str, role: str, actions: Sequence[str]) -> None:
        """Grant `role` the permissions `actions` on one topic only; needs a super user or the tenant's admin."""
        self._call("POST", f"{TopicName.parse(topic).rest_path}/permissions/{quote(role, safe='')}", json=list(actions))

    def set_compaction_threshold(self, namespace: str, threshold_bytes: int) -> None:
        """Let the broker compact each topic of `namespace` once its backlog passes `threshold_bytes` (tenant admin)."""
        self._call("PUT", f"namespaces/{namespace}/compactionThreshold", json=threshold_bytes)

    def namespace_permissions(self, namespace: str) -> dict[str, list[str]]:
        """Each role's granted actions on the namespace; needs a super user or the tenant's admin."""
        return {
            role: list(actions)
            for role, actions in (self._call("GET", f"namespaces/{namespace}/permissions") or {}).items()
        }

    def set_namespace_retention(self, namespace: str, minutes: int = -1, size_mb: int = -1) -> None:
        """Keep acknowledged messages of the namespace's topics (-1: forever, without a size limit).

        Without retention Pulsar deletes the ledgers every subscription has acknowledged; a reader
        from the start then silently begins after them. Needs the tenant's admin.
        """
        self._call(
            "POST", f"namespaces/{namespace}/retention",
            json={"retentionTimeInMinutes": minutes, "retentionSizeInMB": size_mb},
        )  # fmt: skip

    def list_topics(self, namespace: str = "public/default") -> list[str]:
        """Every persistent topic of a namespace: partitions and non-partitioned topics."""
        return list(self._get(f"persistent/{namespace}") or [])

    # -- topics ------------------------------------------------------------------------------

    def create_topic(self, topic: str, partitions: int = 0) -> None:
        """Create a topic; with `partitions` > 0 a partitioned topic."""
        name = TopicName.parse(topic)
        if partitions > 0:
            self._call("PUT", f"{name.rest_path}/partitions", json=partitions)
        else:
            self._call("PUT", name.rest_path)

    def create_subscription(self, topic: str, subscription: str) -> None:
        """Make a durable subscription at the topic's earliest entry, as `pulsar-admin topics create-subscription
        -m earliest` does; one that exists already is left where it is."""
        path = f"{TopicName.parse(topic).rest_path}/subscription/{quote(subscription, safe='')}"
        try:
            self._call("PUT", path, json={"ledgerId": -1, "entryId": -1, "partitionIndex": -1})
        except AdminError as exc:
            if exc.status != 409:
                raise

    def delete_subscription(self, topic: str, subscription: str) -> None:
        """Delete a durable subscription, its consumers disconnected first (`pulsar-admin topics unsubscribe -f`)."""
        path = f"{TopicName.parse(topic).rest_path}/subscription/{quote(subscription, safe='')}"
        self._call("DELETE", path, params={"force": "true"})

    def set_topic_retention(self, topic: str, minutes: int = -1, size_mb: int = -1) -> None:
        """Retention of one existing topic (a topic-level policy; -1: forever, without a size limit)."""
        self._call(
            "POST", f"{TopicName.parse(topic).rest_path}/retention",
            json={"retentionTimeInMinutes": minutes, "retentionSizeInMB": size_mb},
        )  # fmt: skip

    def retention(self, topic: str) -> tuple[int, int]:
        """The retention (minutes, MB) that applies to a topic: its own policy, else its namespace's or the broker's."""
        policy = self._call("GET", f"{TopicName.parse(topic).rest_path}/retention", params={"applied": "true"}) or {}
        return int(policy.get("retentionTimeInMinutes", 0)), int(policy.get("retentionSizeInMB", 0))

    def update_partitions(self, topic: str, partitions: int) -> None:
        """Grow a partitioned topic to `partitions` partitions (Pulsar never shrinks one)."""
        self._call("POST", f"{TopicName.parse(topic).rest_path}/partitions", json=partitions)

    def partitions(self, topic: str) -> int:
        """Number of partitions, 0 for a non-partitioned topic."""
        meta = self._call("GET", f"{TopicName.parse(topic).rest_path}/partitions")
        return int(meta.get("partitions", 0)) if isinstance(meta, dict) else 0

    def internal_stats(self, topic: str) -> dict[str, Any]:
        """The managed ledger's internal stats of one (partition) topic, cursors included."""
        result = self._call("GET", f"{TopicName.parse(topic).rest_path}/internalStats")
        return dict(result)

    def topic_stats(self, topic: str) -> dict[str, Any]:
        return dict(self._call("GET", f"{TopicName.parse(topic).rest_path}/stats"))

    # -- the generator's frequent calls (a plain keep-alive connection per thread) -----------------

    def brief_stats(self, topic: str) -> dict[str, Any]:
        """A (partition) topic's stats without producers and consumers."""
        return dict(self._get(f"{TopicName.parse(topic).rest_path}/stats", BRIEF_STATS))

    def partitioned_brief_stats(self, topic: str) -> dict[str, dict[str, Any]]:
        """Every partition's stats (without producers and consumers) of a partitioned topic, in one call.

        Keyed by partition topic name; a partition whose stats the broker could not get is left out.
        """
        result = self._get(f"{TopicName.parse(topic).rest_path}/partitioned-stats",
                           {**BRIEF_STATS, "perPartition": "true"})  # fmt: skip
        return dict((result or {}).get("partitions") or {})

    def partitioned_summed_stats(self, topic: str) -> dict[str, Any]:
        """A partitioned topic's stats summed over its partitions (counters and backlogs added), in one call.

        A hundredth of `partitioned_brief_stats`' size for 100 partitions: what a change detector reads first.
        """
        return dict(
            self._get(f"{TopicName.parse(topic).rest_path}/partitioned-stats", {**BRIEF_STATS, "perPartition": "false"})
            or {}
        )  # the broker's default is true

    def fast_internal_stats(self, topic: str) -> dict[str, Any]:
        """`internal_stats` on the plain connection."""
        return dict(self._get(f"{TopicName.parse(topic).rest_path}/internalStats"))

    def partitioned_internal_stats(self, topic: str) -> dict[str, dict[str, Any]]:
        """Every partition's internal stats of a partitioned topic, in one call (the broker asks each partition).

        Keyed by partition topic name; a partition whose stats the broker could not get is left out.
        """
        result = self._get(f"{TopicName.parse(topic).rest_path}/partitioned-internalStats")
        return dict((result or {}).get("partitions") or {})

    def mark_delete_position(self, topic: str, subscription: str) -> tuple[int, int]:
        """The subscription's mark-delete position (ledger, entry): everything up to it is acked."""
        cursors = self.internal_stats(topic).get("cursors", {})
        if subscription not in cursors:
            raise TopicNotFound(f"subscription {subscription!r} not found on {topic}", 404)
        return mark_delete_of(cursors[subscription])

    def reset_cursor(self, topic: str, subscription: str, to: int | tuple[int, int] | Any) -> None:
        """Move a subscription's cursor as `pulsar-admin topics reset-cursor` does, consumers attached or not.

        `to` is a publish time in ms (an int), or a message id: `(ledger, entry)` or a
        `pulsar.MessageId`; delivery starts again at that message. Pulsar resets by time on every
        partition of a partitioned topic, by message id only on one partition topic.
        """
        path = f"{TopicName.parse(topic).rest_path}/subscription/{quote(subscription, safe='')}/resetcursor"
        if isinstance(to, int) and not isinstance(to, bool):
            self._call("POST", f"{path}/{to}")
            return
        ledger, entry = (to[0], to[1]) if isinstance(to, tuple) else (to.ledger_id(), to.entry_id())  # type: ignore[union-attr]
        self._call("POST", path, json={"ledgerId": int(ledger), "entryId": int(entry)})

    # -- where topics live (a cluster of several brokers) ----------------------------------------

    def owner(self, topic: str) -> str:
        """The web service URL (`http://host:port`) of the broker that owns a (partition) topic now."""
        answer = self._call("GET", f"topic/{TopicName.parse(topic).rest_path}", api="lookup/v2")
        return str(answer["httpUrl"])

    def bundle_of(self, topic: str) -> str:
        """The namespace bundle (`0x..._0x...`) a topic hashes into: what the load manager moves."""
        return str(self._call("GET", f"topic/{TopicName.parse(topic).rest_path}/bundle", api="lookup/v2"))

    def brokers(self, cluster: str) -> list[str]:
        """The cluster's live brokers as `host:webport` (their broker ids)."""
        return sorted(self._call("GET", f"brokers/{quote(cluster, safe='')}") or [])

    def unload_bundle(self, namespace: str, bundle: str, destination: str | None = None) -> None:
        """Unload a namespace bundle; with `destination` (a broker id, `host:webport`) it is assigned there."""
        params = {"destinationBroker": destination} if destination else None
        self._call("PUT", f"namespaces/{namespace}/{bundle}/unload", params=params)

    def unload_namespace(self, namespace: str) -> None:
        """Unload every topic of `namespace` from the brokers serving them (each loads again at its next client)."""
        self._call("PUT", f"namespaces/{namespace}/unload")

    def split_bundle(self, namespace: str, bundle: str) -> None:
        """Split a bundle in two, and unload both halves (the load manager places them again)."""
        self._call("PUT", f"namespaces/{namespace}/{bundle}/split", params={"unload": "true"})

    def unload_topic(self, topic: str) -> None:
        """Close a topic on its broker; the next lookup assigns it again (maybe to the same broker)."""
        self._call("PUT", f"{TopicName.parse(topic).rest_path}/unload")

    def topic_properties(self, topic: str) -> dict[str, str]:
        """A (partition) topic's properties: kept with its managed ledger, deleted with the topic. Any role that may
        look the topic up (produce or consume) may read them."""
        return dict(self._get(f"{TopicName.parse(topic).rest_path}/properties") or {})

    def set_topic_properties(self, topic: str, properties: dict[str, str]) -> None:
        """Add or replace properties of a (partition) topic: a tenant admin's right (or a super user's)."""
        self._call("PUT", f"{TopicName.parse(topic).rest_path}/properties", json=properties)

    def delete_topic(self, topic: str, force: bool = True) -> None:
        self._call("DELETE", TopicName.parse(topic).rest_path, params={"force": str(force).lower()})

    def trim_topic(self, topic: str) -> None:
        """Delete the ledgers that every subscription has acknowledged, now (as Pulsar does on its own)."""
        self._call("POST", f"{TopicName.parse(topic).rest_path}/trim")

    def trigger_compaction(self, topic: str) -> None:
        self._call("PUT", f"{TopicName.parse(topic).rest_path}/compaction")

    # -- message deduplication (the Spark sink's exactly-once output) ------------------------------

    def deduplication_enabled(self, topic: str) -> bool:
        """Whether Pulsar drops repeated (producer name, sequence id) messages on an existing topic:
        its own policy, else its namespace's, else the broker's `brokerDeduplicationEnabled`."""
        applied = self._call(
            "GET", f"{TopicName.parse(topic).rest_path}/deduplicationEnabled", params={"applied": "true"}
        )
        return bool(applied)

    def set_namespace_deduplication(self, namespace: str, enabled: bool = True) -> None:
        """`pulsar-admin namespaces set-deduplication NAMESPACE --enable` (the tenant's admin)."""
        self._call("POST", f"namespaces/{namespace}/deduplication", json=enabled)

    def set_topic_deduplication(self, topic: str, enabled: bool = True) -> None:
        """`pulsar-admin topics set-deduplication TOPIC --enable` (a topic-level policy; the topic must exist)."""
        self._call("POST", f"{TopicName.parse(topic).rest_path}/deduplicationEnabled", json=enabled)

    def owners_metrics(self, topics: Iterable[str]) -> list[bytes]:
        """The Prometheus text of every broker that owns one of `topics` as far as this client knows (the broker
        its last call about the topic was answered by; the admin URL in use for a topic not asked about yet).

        On a cluster each broker lists only the topics it serves: one read per owning broker.
        """
        origins = {self._owners.get(_topic_key(TopicName.parse(topic).rest_path), self.base_url) for topic in topics}
        return [self.broker_metrics(origin) for origin in sorted(origins or {self.base_url})]

    def plugin_changes(
        self, broker: str, epoch: str, since: int, timeout_ms: int, namespaces: Iterable[str] = (),
        *, intake: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """The topics whose cursors moved on `broker` since sequence `since` of its run `epoch`, from its
        watermark-cursors plugin (broker_ext/plugin/; docs/PROTOCOL.md section 10): a long poll that answers at
        the first move or after `timeout_ms` (keep it below this client's timeout), of the topics in
        `namespaces` only (none: every topic); with `intake`, also the markers found on each topic and the data
        between (broker_ext/intake/plugin_stream.py reads them). On this thread's keep-alive connection (a call
        costs a quarter of one through requests); raises `PluginMissing` where the broker does not serve it."""
        query = urlencode({"epoch": epoch, "since": str(since), "timeoutMs": str(timeout_ms),
                           **({"namespaces": ",".join(namespaces)} if namespaces else {}),
                           **({"intake": "1"} if intake else {})})  # fmt: skip
        headers = {"Accept": "application/json", **self.settings.admin_headers()}
        try:
            response, body = self._keep_alive_get(broker, f"{PLUGIN_CHANGES_PATH}?{query}", headers)
        except (http.client.HTTPException, OSError) as exc:
            raise BrokerUnreachable(f"the broker at {broker} does not answer ({type(exc).__name__})") from exc
        url = f"{broker}{PLUGIN_CHANGES_PATH}"
        if response.status == 404:
            raise PluginMissing(f"{url} answered 404", 404)
        if response.status in (401, 403):
            said = body.decode("utf-8", "replace").strip() if response.getheader("Content-Type", "").startswith(
                "text/plain") else ""  # fmt: skip
            raise PluginMissing(
                f"{url} refused the generator's role ({response.status}): "
                + (
                    said
                    or "the plugin lets in super-users and the role that may produce to the watermark namespace, "
                    "for the namespaces where it may consume"
                )
                + " (docs/SECURITY.md)",
                response.status,
            )
        if response.status >= 400:
            raise AdminError(f"{url} failed with {response.status}", response.status)
        answer: dict[str, Any] = orjson.loads(body)
        return answer

    def plugin_acknowledge(self, broker: str, positions: Mapping[str, tuple[int, int]]) -> dict[str, str]:
        """Move the `__wm_generator` cursor of each topic to its (ledger, entry), inside `broker` by its plugin
        (docs/PROTOCOL.md section 10, "The generator's cursor"), making the subscription where it is missing. Per
        topic: "done", "elsewhere" (`broker` does not serve it) or "failed: ..."; raises `PluginMissing` where
        the broker does not serve the plugin or refuses the role."""
        body = "".join(f"{topic} {ledger} {entry}\n" for topic, (ledger, entry) in positions.items())
        outcomes: dict[str, str] = self._plugin_post(broker, PLUGIN_ACKNOWLEDGE_PATH, body)
        return outcomes

    def plugin_follow(self, broker: str, tokens: Mapping[str, str]) -> PluginFollowed:
        """Have `broker`'s plugin make each topic's `__wm_generator` subscription where missing and set its topic
        property `wm.incarnation` to the token given where unset (docs/PROTOCOL.md section 10, "Following a
        topic"): two admin calls per topic at a take-over, in one request. Raises `PluginMissing` where the broker
        does not serve the plugin (or one older than this request) or refuses the role."""
        body = "".join(f"{topic} {token}\n" for topic, token in tokens.items())
        answer = self._plugin_post(broker, PLUGIN_FOLLOW_PATH, body, timeout_s=PLUGIN_FOLLOW_TIMEOUT_S)
        return PluginFollowed(dict(answer.get("incarnations") or {}), list(answer.get("elsewhere") or []),
                              dict(answer.get("failed") or {}))  # fmt: skip

    def plugin_write_snapshots(self, broker: str, records: Mapping[str, tuple[str, bytes]]) -> dict[str, str]:
        """Have `broker`'s plugin write each topic's record (producer name, payload) into it as a `W_SNAPSHOT`
        message (docs/PROTOCOL.md section 10, "Writing snapshots"). Per topic: "written <ledger> <entry>",
        "elsewhere" (`broker` does not serve it) or "failed: ..."; raises `PluginMissing` where the broker does not
        serve the plugin (or one older than this request) or refuses the role."""
        body = "".join(f"{topic} {producer} {base64.b64encode(payload).decode()}\n"
                       for topic, (producer, payload) in records.items())  # fmt: skip
        outcomes: dict[str, str] = self._plugin_post(broker, PLUGIN_SNAPSHOTS_PATH, body)
        return outcomes

    def _plugin_post(self, broker: str, path: str, body: str, timeout_s: float | None = None) -> Any:
        url = f"{broker}{path}"
        headers = {"Content-Type": "text/plain", "Accept": "application/json", **self.settings.admin_headers()}
        try:
            response = self._http.post(url, data=body.encode(), headers=headers, timeout=timeout_s or self.timeout_s)
        except requests.RequestException as exc:  # refused, reset, timed out
            raise BrokerUnreachable(f"the broker at {broker} does not answer ({type(exc).__name__})") from exc
        if response.status_code in (404, 405, 401, 403):
            raise PluginMissing(f"{url} answered {response.status_code}: {response.text.strip()[:300]}",
                                response.status_code)  # fmt: skip
        if response.status_code >= 400:
            raise AdminError(f"{url} failed with {response.status_code}: {response.text.strip()[:300]}",
                             response.status_code)  # fmt: skip
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise AdminError(f"{url} answered what is not JSON: {response.text.strip()[:300]}") from exc

    def broker_metrics(self, base_url: str | None = None) -> bytes:
        """The Prometheus text of one broker (`/metrics/`; default: the admin URL in use): every topic it serves,
        megabytes.

        The generator reads each subscription's last mark-delete advance from it (broker_ext/intake/ack_watch.py).
        """
        url = f"{base_url or self.base_url}/metrics/"
        try:
            # uncompressed: compressing megabytes for each call doubled the broker's CPU (docs/DECISIONS.md, issue 27)
            response = self._http.get(url, timeout=self.timeout_s,
                                      headers={"Accept": "text/plain", "Accept-Encoding": "identity"})  # fmt: skip
        except requests.RequestException as exc:
            raise AdminError(f"the broker's metrics at {url} do not answer ({type(exc).__name__})") from exc
        if response.status_code in (401, 403):
            raise AdminError(f"the broker refused its metrics at {url} ({response.status_code}): it authenticates "
                             "/metrics (authenticateMetricsEndpoint=true)", response.status_code)  # fmt: skip
        if response.status_code >= 400:
            raise AdminError(f"the broker's metrics at {url} failed with {response.status_code}", response.status_code)
        return response.content


MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)
"""A broker answers an admin call about a topic it does not own with 307 and the owner's URL."""


def admin_urls(text: str) -> list[str]:
    """`PULSAR_ADMIN_URL` as a list: one URL, or several separated by commas as Pulsar's own tools take them
    (`http://b1:8080,b2:8080`: a host without a scheme takes the first URL's)."""
    urls: list[str] = []
    scheme = "http"
    for item in (part.strip().rstrip("/") for part in text.split(",")):
        if not item:
            continue
        if "://" in item:
            scheme = item.split("://", 1)[0]
        else:
            item = f"{scheme}://{item}"
        urls.append(item)
    return urls or [text.rstrip("/")]


def _topic_key(path: str) -> str:
    """The topic a REST path is about (`persistent/t/ns/topic`), or "" for other calls."""
    parts = path.split("?", 1)[0].split("/")
    return "/".join(parts[:4]) if len(parts) >= 4 and parts[0] in ("persistent", "non-persistent") else ""


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


BRIEF_STATS = {"excludePublishers": "true", "excludeConsumers": "true", "subscriptionBacklogSize": "false"}
"""Stats without the lists of producers and consumers: what the generator's change detector reads."""


def parse_position(text: str) -> tuple[int, int]:
    """Parse the admin API's 'ledgerId:entryId' form."""
    ledger, entry = text.split(":", 1)
    return int(ledger), int(entry)


def last_confirmed_entry(internal_stats: dict[str, Any]) -> tuple[int, int]:
    """The partition's last entry (ledger, entry) from its internal stats; (-1, -1) when it has none."""
    return parse_position(str(internal_stats.get("lastConfirmedEntry", "-1:-1")))


def mark_delete_of(cursor: dict[str, Any]) -> tuple[int, int]:
    """A cursor's mark-delete position (ledger, entry) from internal stats: everything up to it is acknowledged."""
    return parse_position(str(cursor.get("markDeletePosition", "-1:-1")))


def durable_subscriptions(topic_stats: dict[str, Any]) -> set[str]:
    """The applications' durable subscriptions in a topic's stats (the generator's own and compaction's left out)."""
    return {
        name for name, sub in (topic_stats.get("subscriptions") or {}).items()
        if sub.get("isDurable", True) and name not in INTERNAL_SUBSCRIPTIONS
    }  # fmt: skip


_OPERATION = re.compile(r"operation \[([A-Z_]+)\]")
_TOPIC_PATH = re.compile(r"^(?:persistent|non-persistent)/([^/]+)/([^/]+)(?:/([^/]+)(?:/(.*))?)?$")
_NAMESPACE_PATH = re.compile(r"^namespaces/([^/]+)/([^/]+)(?:/(.*))?$")
_TENANT_PATH = re.compile(r"^namespaces/([^/]+)$")

_PRODUCE_OR_CONSUME = {"LOOKUP", "GET_STATS", "GET_METADATA", "GET_TOPIC", "GET_TOPICS", "GET_BUNDLE"}
_CONSUME = {
    "CONSUME", "SUBSCRIBE", "UNSUBSCRIBE", "GET_SUBSCRIPTIONS", "SKIP", "EXPIRE_MESSAGES", "PEEK_MESSAGES",
    "RESET_CURSOR", "GET_BACKLOG_SIZE", "CLEAR_BACKLOG",
}  # fmt: skip
_SUPER_USER = {"HEALTH_CHECK", "LIST_CLUSTERS", "CREATE_TENANT", "DELETE_TENANT", "UPDATE_TENANT"}


def required_permission(path: str, operation: str | None = None) -> tuple[str, str | None]:
    """What an admin call needs under Pulsar's default authorization, and on which namespace.

    `operation` is the one Pulsar names in its refusal (e.g. GET_STATS). Topic lists, partition
    metadata, stats and internal stats need produce or consume on the namespace; subscriptions need
    consume; compaction, unloading and policies need tenant admin; broker-wide calls a super user.
    """
    namespace: str | None = None
    rest = ""
    if topic := _TOPIC_PATH.match(path):
        namespace, rest = f"{topic.group(1)}/{topic.group(2)}", topic.group(4) or ""
    elif namespace_call := _NAMESPACE_PATH.match(path):
        namespace, rest = f"{namespace_call.group(1)}/{namespace_call.group(2)}", "policies"
    elif tenant := _TENANT_PATH.match(path):
        return "tenant admin", f"{tenant.group(1)}/*"
    if operation in _SUPER_USER or namespace is None:
        return "a super user", None
    if operation == "PRODUCE":
        return "produce", namespace
    if operation in _CONSUME or (operation is None and "subscription" in rest):
        return "consume", namespace
    if operation in _PRODUCE_OR_CONSUME or (operation is None and rest != "policies" and not _ADMIN_REST.search(rest)):
        return "produce or consume", namespace
    return "tenant admin", namespace


_ADMIN_REST = re.compile(r"(^|/)(compaction|unload|offload|terminate|trim|policies)\b")
