"""Topic-name parsing and position parsing of the admin client."""

from __future__ import annotations

import pytest

from pulsar_access.admin import AdminError, PulsarAdmin, parse_position
from pulsar_access.settings import PulsarSettings
from pulsar_access.topics import TopicName


def test_short_names_live_in_public_default() -> None:
    name = TopicName.parse("orders")
    assert name.full == "persistent://public/default/orders"
    assert name.rest_path == "persistent/public/default/orders"


def test_full_names_keep_tenant_namespace_and_domain() -> None:
    name = TopicName.parse("non-persistent://acme/events/clicks-partition-2")
    assert (name.domain, name.tenant, name.namespace, name.local) == (
        "non-persistent",
        "acme",
        "events",
        "clicks-partition-2",
    )


def test_bad_names_say_the_accepted_forms() -> None:
    with pytest.raises(ValueError, match="persistent://tenant/namespace/name"):
        TopicName.parse("a/b")


def test_position_parsing() -> None:
    assert parse_position("12:345") == (12, 345)
    assert parse_position("-1:-1") == (-1, -1)


def test_an_admin_url_that_does_not_answer_names_the_fix() -> None:
    admin = PulsarAdmin(PulsarSettings(admin_url="http://127.0.0.1:9"), timeout_s=2)
    with pytest.raises(AdminError, match=r"make cluster-up.*PULSAR_ADMIN_URL"):
        admin.list_topics()
    assert admin.healthy() is False
