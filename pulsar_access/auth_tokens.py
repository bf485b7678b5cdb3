"""Token authentication for the local cluster: the broker's secret key, the roles' tokens, the broker settings.

Pulsar's `AuthenticationProviderToken` accepts JWTs signed with a shared secret (HS256); the token's
`sub` claim is the role that authorization checks. The key and the tokens live in `<state dir>/auth/`
and are reused across restarts (a token is a pure function of the key and its role, with no expiry),
so `export PULSAR_AUTH_TOKEN_FILE=...` stays valid for the life of the state directory.
See docs/SECURITY.md.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import jwt

ADMIN_ROLE = "admin"
"""The super user: the cluster's own health check and set-up, and the broker's internal client."""
GENERATOR_ROLE = "wm-generator"
"""The watermark generator (`broker-ext serve`), with only the permissions below."""
CLIENT_ROLE = "client"
"""A sample application role: producers, consumers, Spark jobs, `broker-ext status`."""

GENERATOR_ACTIONS = ("produce", "consume")
"""The generator's least namespace permissions, measured against Pulsar 4.0.7 (docs/SECURITY.md):
consume for its Failover subscription, readers and the admin calls it makes (topic list, partition
metadata, stats, internal stats); produce for its snapshots. On the watermark namespace it has
`GENERATOR_WATERMARK_ACTIONS` (the companion topics); applications have only consume there.
Triggering compaction would need tenant admin; the generator does without it."""
CLIENT_ACTIONS = ("produce", "consume")
GENERATOR_WATERMARK_ACTIONS = ("produce", "consume")
"""On the watermark namespace (`pulsar_access.topics.watermark_namespace`): the generator alone writes there."""
APPLICATION_WATERMARK_ACTIONS = ("consume",)
"""On the watermark namespace, for every application role: read the watermark tables, never write them."""

DEFAULT_NAMESPACE = "public/default"
SECRET_KEY_BYTES = 32
"""256 bits: the key size HS256 calls for (RFC 7518, section 3.2)."""


def create_secret_key() -> bytes:
    return secrets.token_bytes(SECRET_KEY_BYTES)


def create_token(secret_key: bytes, role: str) -> str:
    """A JWT for `role` that Pulsar's token provider accepts when it has `secret_key` (no expiry)."""
    if not role:
        raise ValueError("a token needs a non-empty role")
    return jwt.encode({"sub": role}, secret_key, algorithm="HS256")


def role_of(token: str, secret_key: bytes | None = None) -> str | None:
    """The token's role (`sub`); with `secret_key` the signature is checked, without it only read.

    None if the text is not a JWT with a string subject (or the signature does not match).
    """
    try:
        if secret_key is None:
            claims = jwt.decode(token, options={"verify_signature": False})
        else:
            claims = jwt.decode(token, secret_key, algorithms=["HS256"])
    except jwt.PyJWTError:
        return None
    subject = claims.get("sub")
    return subject if isinstance(subject, str) else None


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read (a key or a token is a credential)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    path.chmod(0o600)


@dataclass(frozen=True)
class TokenAuth:
    """The files of token authentication under `directory` (`<state dir>/auth`)."""

    directory: Path

    @property
    def secret_key_file(self) -> Path:
        return self.directory / "secret.key"

    def token_file(self, role: str) -> Path:
        return self.directory / f"{role}.token"

    def ensure(self, roles: tuple[str, ...] = (ADMIN_ROLE, GENERATOR_ROLE, CLIENT_ROLE)) -> None:
        """Create the secret key once, and a token file for each role whose file is missing or stale."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        if not self.secret_key_file.exists():
            write_private(self.secret_key_file, create_secret_key())
        key = self.secret_key_file.read_bytes()
        for role in roles:
            path = self.token_file(role)
            if not path.exists() or role_of(path.read_text().strip(), key) != role:
                write_private(path, (create_token(key, role) + "\n").encode())

    def token(self, role: str) -> str:
        return self.token_file(role).read_text().strip()

    def broker_config(self, super_user: str = ADMIN_ROLE) -> dict[str, str]:
        """standalone.conf settings: tokens for clients and the web API, authorization, the broker's own client."""
        return {
            "authenticationEnabled": "true",
            "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
            "tokenSecretKey": self.secret_key_file.resolve().as_uri(),
            "authorizationEnabled": "true",
            "authorizationProvider": "org.apache.pulsar.broker.authorization.PulsarAuthorizationProvider",
            "superUserRoles": super_user,
            "brokerClientAuthenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
            "brokerClientAuthenticationParameters": self.token_file(super_user).resolve().as_uri(),
        }
