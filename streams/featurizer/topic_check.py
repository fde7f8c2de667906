"""The featurizer's start-up check of its topics (docs/featurizer.md: exit 2 on missing topics)."""

from __future__ import annotations

from typing import Any

from unlearn.infra.settings import Settings
from unlearn.infra.topics import ensure_topic, raw_input_config
from unlearn.streams.featurizer.model import FeaturizerError

__all__ = ["check_topics"]


def check_topics(settings: Settings, consumer: Any, requests_topic: str, routed_topic: str, registry_topic: str,
                 changelog_topic: str | None) -> tuple[int, int]:
    """(the by-head topic's partition count, which heads are routed by; the requests topic's
    partition count, which transit keys are followed by). Why checked: a missing
    topic would be auto-created by tansu with 4 partitions. The requests topic must exist; its
    by-head topic is created if missing (with the requests topic's partition count); the head
    registry must exist; the changelog must exist (never auto-created) with a partition per
    by-head partition. FeaturizerError otherwise."""
    md = consumer.list_topics(timeout=settings.admin_timeout)  # all topics: never creates one
    req = md.topics.get(requests_topic)
    if req is None or req.error is not None or not req.partitions:
        raise FeaturizerError(f"requests topic {requests_topic!r} is missing: run `unlearn topics create`")
    routed = md.topics.get(routed_topic)
    if routed is None or routed.error is not None or not routed.partitions:
        ensure_topic(settings, routed_topic, partitions=len(req.partitions), config=raw_input_config(settings))
        md = consumer.list_topics(timeout=settings.admin_timeout)
        routed = md.topics[routed_topic]
    route_partitions, request_partitions = len(routed.partitions), len(req.partitions)
    reg = md.topics.get(registry_topic)
    if reg is None or reg.error is not None:
        raise FeaturizerError(f"head registry topic {registry_topic!r} is missing: run `unlearn topics create`")
    if changelog_topic is None:
        return route_partitions, request_partitions
    cl = md.topics.get(changelog_topic)
    if cl is None or cl.error is not None:
        raise FeaturizerError(f"changelog topic {changelog_topic!r} is missing: run `unlearn topics create`")
    if len(cl.partitions) < route_partitions:
        raise FeaturizerError(f"changelog topic {changelog_topic!r} has {len(cl.partitions)} partitions, "
                              f"{routed_topic!r} has {route_partitions}: they must be co-partitioned")
    return route_partitions, request_partitions
