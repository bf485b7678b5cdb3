"""Connection settings every component reads from the environment (contract section 4).

One place so that the generator, the status command, the local cluster tooling and the tests agree
on where Pulsar is and how to authenticate to it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pulsar

DEFAULT_SERVICE_URL = "pulsar://127.0.0.1:6650"
DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class PulsarSettings:
    """Where the cluster is and the credentials to use (a token, if any)."""

    service_url: str = DEFAULT_SERVICE_URL
    admin_url: str = DEFAULT_ADMIN_URL
    auth_token: str | None = None
    listener_name: str | None = None
    """The broker's advertised listener to be given in lookups (`advertisedListeners`), for a client that
    reaches the brokers by another route than the others; None: the broker's internal one."""

    @classmethod
    def from_env(cls) -> PulsarSettings:
        """Read `PULSAR_SERVICE_URL`, `PULSAR_ADMIN_URL`, `PULSAR_AUTH_TOKEN[_FILE]` and `PULSAR_LISTENER_NAME`."""
        token = os.environ.get("PULSAR_AUTH_TOKEN") or None
        token_file = os.environ.get("PULSAR_AUTH_TOKEN_FILE")
        if token is None and token_file:
            token = Path(token_file).read_text().strip()
        return cls(
            service_url=os.environ.get("PULSAR_SERVICE_URL", DEFAULT_SERVICE_URL),
            admin_url=os.environ.get("PULSAR_ADMIN_URL", DEFAULT_ADMIN_URL).rstrip("/"),
            auth_token=token,
            listener_name=os.environ.get("PULSAR_LISTENER_NAME") or None,
        )

    def client(self, **options: object) -> pulsar.Client:
        """A `pulsar.Client` for these settings; further client options pass through."""
        options.setdefault("logger", pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        if self.auth_token is not None and "authentication" not in options:
            options["authentication"] = pulsar.AuthenticationToken(self.auth_token)
        if self.listener_name is not None:
            options.setdefault("listener_name", self.listener_name)
        return pulsar.Client(self.service_url, **options)

    def admin_headers(self) -> dict[str, str]:
        """HTTP headers for the admin REST API."""
        if self.auth_token is None:
            return {}
        return {"Authorization": f"Bearer {self.auth_token}"}
