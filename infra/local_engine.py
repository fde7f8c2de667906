"""A local broker of either engine, for the demo and the benchmarks: one switch, one code path.

``local_broker("tansu")`` is the embedded tansu (``infra.broker.LocalBroker``, in memory);
``local_broker("kafka")`` the project's Apache Kafka (``infra.kafka_broker.LocalKafka``, the jars
of ``make kafka``, a temporary directory unless ``data_dir``). Both start with ``start()`` or
``with``, expose ``bootstrap`` and stop with ``stop()``; the engine's name is also the client
profile (``Settings.profile``) that goes with it. docs/design.md, "The embedded broker", says
which one ``make demo`` uses and why.
"""

from __future__ import annotations

import os
from typing import Literal

from unlearn.infra.broker import LocalBroker
from unlearn.infra.kafka_broker import LocalKafka, kafka_version

__all__ = ["ENGINES", "Engine", "describe_engine", "local_broker"]

Engine = Literal["tansu", "kafka"]
#: The engines a local broker can run, the demo's default first.
ENGINES: tuple[Engine, ...] = ("tansu", "kafka")


def local_broker(
    engine: str,
    *,
    log_path: str | os.PathLike[str] | None = None,
    nodes: int = 1,
    data_dir: str | os.PathLike[str] | None = None,
) -> LocalBroker | LocalKafka:
    """An unstarted local broker of ``engine``. ``log_path`` is tansu's log file (each Kafka node
    logs to ``<its dir>/kafka.log``); ``nodes`` is Kafka's only."""
    if engine == "kafka":
        return LocalKafka(nodes, data_dir=data_dir)
    if engine != "tansu":
        raise ValueError(f"unknown broker engine {engine!r}: choose from {', '.join(ENGINES)}")
    if nodes != 1:
        raise ValueError("tansu runs one broker: nodes must be 1")
    return LocalBroker(data_dir=data_dir, log_path=log_path)


def describe_engine(engine: str, nodes: int = 1) -> str:
    """How results name the broker: ``tansu (memory)`` or ``Apache Kafka 4.4.0 (1 node, KRaft)``."""
    if engine == "kafka":
        return f"Apache Kafka {kafka_version()} ({nodes} node{'s' if nodes != 1 else ''}, KRaft)"
    return "tansu (memory)"
