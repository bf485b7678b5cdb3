"""One `pulsar.Client` per Python process and connection settings, reused across Spark tasks.

Spark reuses its Python worker processes from task to task (`spark.python.worker.reuse`, on by
default), so a module-level client serves every task a worker runs: a task opens only its reader or
producer, not a new client with its own connections and threads. Clients are closed when the
process exits.

Also here: `pulsar.client.*` options as Spark users write them, turned into `pulsar.Client` keyword
arguments.
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import inspect
import threading
from collections.abc import Mapping
from typing import Any

import pulsar

from pulsar_access.settings import PulsarSettings

CLIENT_OPTION_PREFIX = "pulsar.client."
_NOT_PASSED = {"self", "service_url", "authentication", "logger"}

_clients: dict[tuple[Any, ...], pulsar.Client] = {}
_lock = threading.Lock()


def shared_client(settings: PulsarSettings, options: Mapping[str, Any] | None = None) -> pulsar.Client:
    """This process's client for `settings` and `options` (created on first use, closed at exit)."""
    options = dict(options or {})
    key = (settings.service_url, settings.auth_token, tuple(sorted(options.items())))
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = settings.client(**options)
            _clients[key] = client
        return client


@atexit.register
def _close_all() -> None:
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
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
