"""One `pulsar.Client` per Python process and connection settings, reused across Spark tasks.

Spark reuses its Python worker processes from task to task (`spark.python.worker.reuse`, on by
default), so a module-level client serves every task a worker runs: a task opens only its reader or
producer, not a new client with its own connections and threads. Readers are kept too: a stream's
next batch on a partition starts where the last one stopped, so a task that finds the reader a
previous task left there reads on with it instead of creating one (a lookup, a subscribe and a seek
on the broker each time). Clients and readers are closed when the process exits.

Also here: `pulsar.client.*` options as Spark users write them, turned into `pulsar.Client` keyword
arguments.
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import inspect
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import pulsar

from pulsar_access.settings import PulsarSettings

CLIENT_OPTION_PREFIX = "pulsar.client."
_NOT_PASSED = {"self", "service_url", "authentication", "logger"}

READER_SKIP_ENTRIES = 1000
"""A kept reader this few entries behind a task's start (same ledger) reads on to it: Spark hands a
partition's next range to whichever Python worker is free, so a worker's reader often missed one
batch; reading through its prefetched messages is cheaper than a new reader."""
READER_IDLE_S = 120.0
"""A kept reader no task has used for this long is closed (its partition is no longer read here)."""

_clients: dict[tuple[Any, ...], pulsar.Client] = {}
_lock = threading.Lock()


class KeptReader(NamedTuple):
    """A reader a task left open: it has handed out every message up to `position` and, if `pending`
    is not None, that one message after it too (read to find the range's end, not yet used)."""

    reader: Any
    position: tuple[int, int]
    pending: Any
    since: float


_readers: dict[tuple[Any, ...], KeptReader] = {}


def _client_key(settings: PulsarSettings, options: Mapping[str, Any] | None) -> tuple[Any, ...]:
    return (settings.service_url, settings.auth_token, tuple(sorted(dict(options or {}).items())))


def shared_client(settings: PulsarSettings, options: Mapping[str, Any] | None = None) -> pulsar.Client:
    """This process's client for `settings` and `options` (created on first use, closed at exit)."""
    options = dict(options or {})
    key = _client_key(settings, options)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = settings.client(**options)
            _clients[key] = client
        return client


def take_reader(
    settings: PulsarSettings, options: Mapping[str, Any] | None, topic: str, position: tuple[int, int] | None
) -> KeptReader | None:
    """The reader a task left on `topic` at `position` or a little before it (the caller skips what
    it reads up to `position`), taken out so no other task uses it meanwhile; None if there is none.
    A reader left elsewhere on `topic` is closed: it is stale."""
    with _lock:
        kept = _readers.pop((*_client_key(settings, options), topic), None)
    if kept is not None and position is not None and _within(kept.position, position):
        return kept
    if kept is not None:
        _close(kept.reader)
    return None


def _within(kept: tuple[int, int], wanted: tuple[int, int]) -> bool:
    return kept[0] == wanted[0] and 0 <= wanted[1] - kept[1] <= READER_SKIP_ENTRIES


def keep_reader(
    settings: PulsarSettings,
    options: Mapping[str, Any] | None,
    topic: str,
    reader: Any,
    position: tuple[int, int],
    pending: Any = None,
) -> None:
    """Leave `reader` open for the task that reads `topic` on after `position`; readers idle for
    `READER_IDLE_S` are closed."""
    now = time.monotonic()
    with _lock:
        replaced = _readers.pop((*_client_key(settings, options), topic), None)
        _readers[(*_client_key(settings, options), topic)] = KeptReader(reader, position, pending, now)
        idle = [key for key, kept in _readers.items() if now - kept.since > READER_IDLE_S]
        closing = [_readers.pop(key).reader for key in idle] + ([replaced.reader] if replaced else [])
    for old in closing:
        _close(old)


def _close(reader: Any) -> None:
    with contextlib.suppress(Exception):
        reader.close()


@atexit.register
def _close_all() -> None:
    with _lock:
        clients = list(_clients.values())
        readers = [kept.reader for kept in _readers.values()]
        _clients.clear()
        _readers.clear()
    for reader in readers:
        _close(reader)
    for client in clients:
        with contextlib.suppress(Exception):
            client.close()


def _client_parameters() -> dict[str, inspect.Parameter]:
    """`pulsar.Client`'s keyword arguments we pass through, by name without underscores, lower case."""
    parameters = inspect.signature(pulsar.Client.__init__).parameters
    return {name.replace("_", "").lower(): p for name, p in parameters.items() if name not in _NOT_PASSED}


def client_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`pulsar.client.<name>` options as `pulsar.Client` keyword arguments, values typed like their defaults.

    `<name>` is the keyword argument in either spelling (`operation_timeout_seconds` or
    `operationTimeoutSeconds`; Spark lower-cases option names). An unknown one names the closest.
    """
    parameters = _client_parameters()
    found: dict[str, Any] = {}
    for raw_name, raw_value in options.items():
        name = str(raw_name)
        if not name.lower().startswith(CLIENT_OPTION_PREFIX):
            continue
        wanted = name[len(CLIENT_OPTION_PREFIX) :].replace("_", "").lower()
        parameter = parameters.get(wanted)
        if parameter is None:
            close = difflib.get_close_matches(wanted, list(parameters), n=1, cutoff=0.6)
            hint = f"did you mean '{CLIENT_OPTION_PREFIX}{parameters[close[0]].name}'? " if close else ""
            known = ", ".join(sorted(p.name for p in parameters.values()))
            raise ValueError(f"unknown option '{name}': {hint}pulsar.Client takes {known}")
        found[parameter.name] = _typed(name, str(raw_value), parameter.default)
    return found


def _typed(name: str, value: str, default: Any) -> Any:
    if isinstance(default, bool):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"option '{name}' must be true or false, got {value!r}")
        return value.lower() == "true"
    try:
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise ValueError(f"option '{name}' must be a number, got {value!r}") from None
    return value
