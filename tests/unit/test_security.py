"""Security without a broker: identity is the Pulsar producer name, tokens, the auth cluster's settings."""

from __future__ import annotations

import stat
from pathlib import Path

import msgpack
import pytest

from devtools.local_cluster import ClusterError, LocalCluster, main
from pulsar_access.admin import required_permission
from pulsar_access.auth_tokens import (
    ADMIN_ROLE,
    CLIENT_ROLE,
    GENERATOR_ROLE,
    TokenAuth,
    create_secret_key,
    create_token,
    role_of,
)
from watermark_core.protocol import MARKER_PROPERTY, Marker, MarkerKind, decode_marker
from watermark_core.snapshot import state_to_dict
from watermark_core.state import WatermarkState


def _marker(kind: MarkerKind, body: dict[str, object], producer: str, entry: int) -> Marker:
    """A marker as the generator reads it: `producer` is the message's Pulsar producer name."""
    payload = msgpack.packb({"v": 1, **body}, use_bin_type=True)
    marker = decode_marker({MARKER_PROPERTY: kind.value}, payload, producer, (1, entry, -1), 1_000 + entry)
    assert marker is not None
    return marker


def test_a_marker_naming_another_producer_in_its_payload_changes_nothing_for_that_producer() -> None:
    state = WatermarkState.initial().apply(_marker(MarkerKind.W_SET, {"event_time": 100}, "alice", 0))
    before = state_to_dict(state)["producers"]["alice"]
    forged: dict[str, object] = {"producer": "alice", "producer_name": "alice", "producerName": "alice"}
    # mallory, the broker-known sender, claims to speak for alice: W_SET far ahead, then W_IDLE
    forged_set = _marker(MarkerKind.W_SET, {"event_time": 500, **forged}, "mallory", 1)
    forged_idle = _marker(MarkerKind.W_IDLE, forged, "mallory", 2)
    assert forged_set.producer == forged_idle.producer == "mallory"
    state = state.apply(forged_set).apply(forged_idle)

    after = state_to_dict(state)["producers"]["alice"]
    assert (after["event_time"], after["idle"]) == (before["event_time"], before["idle"]) == (100, False)
    assert state.active_producers() == {"alice": 100}
    assert state.idle_producers() == ["mallory"]
    assert state.watermark == 100  # had alice been moved to 500 or idled, the watermark would be 500


def test_tokens_carry_the_role_and_need_the_key() -> None:
    key = create_secret_key()
    token = create_token(key, "wm-generator")
    assert role_of(token, key) == "wm-generator"
    assert role_of(token) == "wm-generator"  # read without the key, for error messages
    assert role_of(token, create_secret_key()) is None  # another cluster's key: not accepted
    assert role_of("not-a-jwt") is None
    with pytest.raises(ValueError, match="role"):
        create_token(key, "")


def test_token_files_are_private_and_reused_across_restarts(tmp_path: Path) -> None:
    auth = TokenAuth(tmp_path / "auth")
    auth.ensure()
    key = auth.secret_key_file.read_bytes()
    tokens = {role: auth.token(role) for role in (ADMIN_ROLE, GENERATOR_ROLE, CLIENT_ROLE)}
    assert {role: role_of(token, key) for role, token in tokens.items()} == {r: r for r in tokens}
    for path in (auth.secret_key_file, *(auth.token_file(r) for r in tokens)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    auth.ensure()  # a second cluster-up keeps the key, so exported token files stay valid
    assert auth.secret_key_file.read_bytes() == key
    assert {role: auth.token(role) for role in tokens} == tokens


def test_the_auth_switch_writes_token_authentication_and_authorization_into_standalone_conf(tmp_path: Path) -> None:
    cluster = LocalCluster(state_dir=tmp_path, auth="token", with_generator=False)
    cluster.tokens.ensure()
    conf = dict(line.split("=", 1) for line in cluster.write_config().read_text().splitlines())
    assert conf["authenticationEnabled"] == conf["authorizationEnabled"] == "true"
    assert conf["authenticationProviders"].endswith("AuthenticationProviderToken")
    assert conf["superUserRoles"] == ADMIN_ROLE
    assert conf["tokenSecretKey"] == cluster.tokens.secret_key_file.resolve().as_uri()
    assert conf["brokerClientAuthenticationPlugin"].endswith("AuthenticationToken")
    assert conf["brokerClientAuthenticationParameters"] == cluster.tokens.token_file(ADMIN_ROLE).resolve().as_uri()
    assert cluster.admin_settings().auth_token == cluster.tokens.token(ADMIN_ROLE)

    plain = LocalCluster(state_dir=tmp_path / "plain", with_generator=False)
    plain.state_dir.mkdir()
    assert "authenticationEnabled" not in plain.write_config().read_text()
    assert plain.admin_settings().auth_token is None


def test_an_unknown_auth_mode_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ClusterError, match="token"):
        LocalCluster(state_dir=tmp_path, auth="kerberos")
    monkeypatch.setenv("PULSAR_WM_AUTH", "kerberos")
    assert main(["status", "--state-dir", str(tmp_path)]) == 1


def test_admin_calls_name_the_permission_they_need() -> None:
    assert required_permission("persistent/public/default", "GET_TOPICS") == ("produce or consume", "public/default")
    assert required_permission("persistent/public/default/t/internalStats", "GET_STATS")[0] == "produce or consume"
    assert required_permission("persistent/public/default/t/subscriptions")[0] == "consume"
    assert required_permission("persistent/public/default/t/compaction", "COMPACT")[0] == "tenant admin"
    assert required_permission("persistent/public/default/t/compaction")[0] == "tenant admin"
    assert required_permission("namespaces/public/default/permissions/r")[0] == "tenant admin"
    assert required_permission("brokers/health", "HEALTH_CHECK") == ("a super user", None)
