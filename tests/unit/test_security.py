"""Security without a broker: identity is the Pulsar producer name, tokens, the auth cluster's settings."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import msgpack
import pytest

from broker_ext import config as generator_config
from broker_ext.service import is_followable
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
from tests.unit.test_generator_config import serve_args
from watermark_core.protocol import MARKER_PROPERTY, Marker, MarkerKind, decode_marker
from watermark_core.snapshot import SnapshotKeys, state_to_dict
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


# -- the generator's snapshot key and watermark namespace ------------------------------------------------


def test_the_snapshot_key_comes_from_the_variable_then_the_file_else_a_random_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("WM_SNAPSHOT_KEY", "WM_SNAPSHOT_KEY_FILE", "WM_WATERMARK_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    key_file = tmp_path / "snapshot.key"
    key_file.write_text("new-key-after-the-rotation-1234\nold-key-before-the-rotation-5678\n")
    from_file = serve_args("--snapshot-key-file", str(key_file))
    assert from_file.snapshot_keys == SnapshotKeys.from_text(key_file.read_text())
    assert len(from_file.snapshot_keys.keys) == 2 and from_file.snapshot_key_source == str(key_file)
    monkeypatch.setenv("WM_SNAPSHOT_KEY_FILE", str(key_file))
    assert serve_args().snapshot_keys == from_file.snapshot_keys
    monkeypatch.setenv("WM_SNAPSHOT_KEY", "the-variable-wins-over-the-file")
    assert serve_args().snapshot_keys == SnapshotKeys.from_text("the-variable-wins-over-the-file")
    monkeypatch.delenv("WM_SNAPSHOT_KEY")
    monkeypatch.delenv("WM_SNAPSHOT_KEY_FILE")

    first, second = serve_args(), serve_args()
    assert first.snapshot_key_source is None and first.snapshot_keys.ids != second.snapshot_keys.ids
    with caplog.at_level(logging.WARNING):
        generator_config.warn_about_snapshot_key(first)
        generator_config.warn_about_snapshot_key(from_file)
    assert len(caplog.records) == 1 and "no snapshot key" in caplog.records[0].getMessage()
    assert "retains" in caplog.records[0].getMessage()

    (tmp_path / "empty.key").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        serve_args("--snapshot-key-file", str(tmp_path / "empty.key"))
    with pytest.raises(ValueError, match="cannot read the snapshot key file"):
        serve_args("--snapshot-key-file", str(tmp_path / "missing.key"))
    (tmp_path / "short.key").write_text("short\n")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        serve_args("--snapshot-key-file", str(tmp_path / "short.key"))


def test_the_watermark_namespace_flag_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WM_WATERMARK_NAMESPACE", raising=False)
    monkeypatch.setenv("WM_SNAPSHOT_KEY", "a-key-long-enough-for-the-test")
    assert serve_args().watermark_namespace == "public/__watermarks"
    monkeypatch.setenv("WM_WATERMARK_NAMESPACE", "wm-system/tables")
    assert serve_args().watermark_namespace == "wm-system/tables"
    assert serve_args("--watermark-namespace", "a/b").watermark_namespace == "a/b"
    with pytest.raises(ValueError, match="tenant/namespace"):
        serve_args("--watermark-namespace", "nope")
    assert is_followable("persistent://public/default/x", "a/b")
    assert not is_followable("persistent://a/b/public~default~x", "a/b")
    assert not is_followable("persistent://public/default/x__watermarks", "a/b")


def test_cluster_up_keeps_one_private_snapshot_key(tmp_path: Path) -> None:
    cluster = LocalCluster(state_dir=tmp_path, with_generator=False)
    path = cluster.ensure_snapshot_key()
    key = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key.strip()) == 64
    assert cluster.ensure_snapshot_key().read_text() == key  # reused across restarts: snapshots keep verifying
    assert SnapshotKeys.from_text(key).ids[0]
