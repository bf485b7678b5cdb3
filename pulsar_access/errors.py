"""Pulsar client errors explained: one line that says what failed, where, and what to do about it.

The producer, the consumer, the generator, `broker-ext status` and the Spark source all create Pulsar
producers, consumers and readers; when that fails the Pulsar client raises a bare
`Timeout('Pulsar error: TimeOut')` or `TopicNotFound(...)` that names neither the broker nor the fix.
`explained(...)` turns those into a `PulsarClientError` whose message does.

No I/O here: it looks pulsar's exception classes up on the exception it is given, by name along
its class hierarchy, so it needs no `pulsar` import of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pulsar_access.topics import TOPIC_FORMS, is_watermark_topic, namespace_of

SERVICE_URL_FIX = "start one with `make cluster-up` or set PULSAR_SERVICE_URL to the broker's pulsar://host:6650 URL"
AUTH_FIX = "set PULSAR_AUTH_TOKEN or PULSAR_AUTH_TOKEN_FILE to a valid token"


class PulsarClientError(Exception):
    """A Pulsar client call failed for a reason the user has to fix; `str()` is one line naming the fix.

    Every raised instance is also an instance of the pulsar exception it explains (its `__cause__`),
    and a broker that does not answer is also a `pulsar.ConnectError` (the client itself raises
    `pulsar.Timeout` for it), so `except pulsar.ConnectError`, `except pulsar.TopicNotFound` or
    `except pulsar.PulsarException` keep working.
    """

    def __init__(self, message: str, *, service_url: str | None = None, fix: str = "") -> None:
        super().__init__(message)
        self.service_url = service_url
        self.fix = fix


def service_url_of(client: Any) -> str | None:
    """The service URL a `pulsar.Client` was created with (None if this client version cannot say)."""
    try:
        return str(client.get_service_info().service_url)
    except Exception:  # older clients have no get_service_info()
        return None


def _names(exc: BaseException) -> list[str]:
    """The class names along the exception's hierarchy, most specific first."""
    return [cls.__name__ for cls in type(exc).__mro__]


def _is_pulsar(exc: BaseException) -> bool:
    return "PulsarException" in _names(exc)


def explain(
    exc: BaseException, *, service_url: str | None = None, topic: str | None = None, doing: str = "reach"
) -> PulsarClientError | None:
    """A `PulsarClientError` explaining `exc`, or None if it is not a Pulsar client error we can explain.

    `doing` says what the caller tried, e.g. "create a producer on" or "subscribe to", and reads
    with `topic` after it.
    """
    if not _is_pulsar(exc) or isinstance(exc, PulsarClientError):
        return None
    names = _names(exc)
    url = service_url or "the service URL given to pulsar.Client"
    what = f"{doing} {topic}" if topic else doing
    kind = names[0]
    unreachable = False
    if kind in ("Timeout", "ConnectError"):
        unreachable = True
        fix = SERVICE_URL_FIX
        message = (
            f"no Pulsar broker answered at {url} when trying to {what} ({kind}); {fix}; "
            f"if the broker requires authentication, {AUTH_FIX}"
        )
    elif kind in ("LookupError", "InvalidUrl"):
        fix = "check that PULSAR_SERVICE_URL is a broker's service URL (pulsar://host:6650 or http://host:8080)"
        message = f"the broker at {url} could not look up {topic or 'the topic'} ({kind}); {fix}"
    elif kind == "TopicNotFound" and _is_watermark_table(topic):
        namespace = namespace_of(topic or "")
        fix = (
            f"start the watermark generator (it creates the namespace where the broker lets it) or, as an admin, "
            f"create it (pulsar-admin namespaces create {namespace}; docs/SECURITY.md), or set WM_WATERMARK_NAMESPACE "
            "to the generator's"
        )
        message = f"the watermark namespace {namespace} of {topic} does not exist at {url} ({kind}); {fix}"
    elif kind == "TopicNotFound":
        namespace = namespace_of(topic or "")
        fix = (
            f"create its namespace (pulsar-admin namespaces create {namespace}) or the topic "
            "(pulsar-admin topics create), or check the topic name"
        )
        message = f"topic {topic} does not exist at {url} and the broker did not create it ({kind}); {fix}"
    elif kind == "InvalidTopicName":
        fix = f"use {TOPIC_FORMS}"
        message = f"{topic!r} is not a valid topic name ({kind}); {fix}"
    elif kind == "AuthenticationError":
        fix = f"{AUTH_FIX} (or pass authentication=pulsar.AuthenticationToken(...) to pulsar.Client)"
        message = f"the broker at {url} refused the client's credentials when trying to {what} ({kind}); {fix}"
    elif kind == "AuthorizationError":
        namespace = namespace_of(topic or "")
        # an application reads the watermark tables and must never be granted produce there (docs/SECURITY.md)
        actions = "consume" if _is_watermark_table(topic) else "produce,consume"
        fix = (
            f"grant the token's role the permission (pulsar-admin namespaces grant-permission {namespace} "
            f"--role ROLE --actions {actions}) or set PULSAR_AUTH_TOKEN / PULSAR_AUTH_TOKEN_FILE to a token "
            "that has it"
        )
        message = f"the broker at {url} does not allow this client to {what} ({kind}); {fix}"
    elif kind == "ProducerBusy":
        fix = "give this producer another producer_name, or close the one that is connected"
        message = f"a producer with this name is already connected to {topic} ({kind}); {fix}"
    elif kind == "ConsumerBusy":
        fix = "close the other consumer, or subscribe with consumer_type=pulsar.ConsumerType.Shared or Failover"
        message = f"the subscription on {topic} already has its exclusive consumer ({kind}); {fix}"
    else:
        return None
    error = _explained_type(type(exc), unreachable)(message, service_url=service_url, fix=fix)
    error.__cause__ = exc
    return error


def _is_watermark_table(topic: str | None) -> bool:
    """Whether `topic` is a companion topic in the watermark namespace (where only the generator writes)."""
    try:
        return topic is not None and is_watermark_topic(topic)
    except ValueError:
        return False


_EXPLAINED_TYPES: dict[tuple[type[BaseException], bool], type[PulsarClientError]] = {}


def _explained_type(pulsar_type: type[BaseException], unreachable: bool) -> type[PulsarClientError]:
    """`PulsarClientError` that is also the original pulsar exception class (and ConnectError if unreachable)."""
    known = _EXPLAINED_TYPES.get((pulsar_type, unreachable))
    if known is not None:
        return known
    bases: tuple[type[BaseException], ...] = (PulsarClientError, pulsar_type)
    if unreachable and pulsar_type.__name__ != "ConnectError":
        connect_error = getattr(__import__(pulsar_type.__module__), "ConnectError", None)
        if isinstance(connect_error, type) and issubclass(connect_error, BaseException):
            bases += (connect_error,)
    explained: type[PulsarClientError] = type(
        "PulsarClientError", bases, {"__module__": __name__, "__qualname__": "PulsarClientError"}
    )
    _EXPLAINED_TYPES[(pulsar_type, unreachable)] = explained
    return explained


@contextmanager
def explained(*, service_url: str | None, topic: str | None = None, doing: str = "reach") -> Iterator[None]:
    """Raise a `PulsarClientError` instead of a Pulsar client error it explains; anything else passes."""
    try:
        yield
    except Exception as exc:
        error = explain(exc, service_url=service_url, topic=topic, doing=doing)
        if error is None:
            raise
        raise error from exc


SERVICE_URL_SCHEMES = ("pulsar", "pulsar+ssl", "http", "https")
ADMIN_URL_SCHEMES = ("http", "https")


def checked_url(url: str, *, name: str, schemes: tuple[str, ...], example: str) -> str:
    """`url` if it has one of `schemes` and a host; else ValueError naming the setting `name` and an example."""
    scheme, sep, rest = url.partition("://")
    host = rest.split("/", 1)[0]
    if not sep or scheme.lower() not in schemes or not host or host.startswith(":"):
        forms = " or ".join(f"{s}://" for s in schemes)
        raise ValueError(f"{name} {url!r} is not a {forms} URL; set it to e.g. {example}")
    return url


def checked_service_url(url: str, name: str = "PULSAR_SERVICE_URL") -> str:
    return checked_url(url, name=name, schemes=SERVICE_URL_SCHEMES, example="pulsar://127.0.0.1:6650")


def checked_admin_url(url: str, name: str = "PULSAR_ADMIN_URL") -> str:
    return checked_url(url, name=name, schemes=ADMIN_URL_SCHEMES, example="http://127.0.0.1:8080")
