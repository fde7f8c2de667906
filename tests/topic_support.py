"""What the broker holds, read by a test with an admin client of its own (never through the
object under test): the topics, and one topic's configs."""

from __future__ import annotations

from unlearn.infra.settings import Settings
from unlearn.runtime.clients import admin_config


def broker_topics(s: Settings) -> list[str]:
    """Every topic on the broker (whole-cluster metadata: naming one may auto-create it)."""
    from confluent_kafka.admin import AdminClient

    return list(AdminClient(admin_config(s)).list_topics(timeout=30).topics)


def topic_configs(s: Settings, topic: str) -> dict[str, str]:
    """``topic``'s configs as the broker reports them."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient(admin_config(s))  # kept until the answer is in: a dropped client aborts it
    got = admin.describe_configs([res])[res].result(timeout=30)
    return {k: v.value for k, v in got.items()}
