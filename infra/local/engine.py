"""A local broker of either engine, for the demo and the benchmarks: one switch, one code path.

``local_broker("tansu")`` is the embedded tansu (``infra.local.tansu.LocalBroker``, in memory);
``local_broker("kafka")`` the project's Apache Kafka (``infra.local.kafka.LocalKafka``, the jars
of ``make kafka``, a temporary directory unless ``data_dir``). Both start with ``start()`` or
``with``, expose ``bootstrap`` and stop with ``stop()``; the engine's name is also the client
profile (``Settings.profile``) that goes with it. docs/design.md, "The embedded broker", says
which one ``make demo`` uses and why.
"""

from __future__ import annotations

import os
import sys
from typing import Literal

from unlearn.infra.cli_args import log_ready
from unlearn.infra.local.kafka import LocalKafka
from unlearn.infra.local.kafka_jvm import kafka_version
from unlearn.infra.local.tansu import LocalBroker
from unlearn.infra.processes import stop_on_signal, watch_until_stopped
from unlearn.infra.settings import Settings

__all__ = ["ENGINES", "Engine", "describe_engine", "local_broker", "run_kafka_forever"]

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


def run_kafka_forever(
    port: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    nodes: int = 1,
    *,
    settings: Settings | None = None,
    admin_password: str | None = None,
    tls_dir: str | None = None,
) -> int:
    """Body of ``unlearn broker --engine kafka``: run the cluster until SIGINT/SIGTERM.

    Prints one line per node, ``node=<id> pid=<pid> bootstrap=<host:port>`` (so an operator or a
    test can kill one), then ``bootstrap=<all nodes>``, then logs the readiness line. Returns 0
    after a signal, 1 if a node died by itself. With ``admin_password`` (``--secure``) the cluster is
    secured as the compose deployment's broker (infra/local/secured_kafka.py; the users and ACLs then come
    from ``infra/kafka/init.sh``) with the operator's certificates in ``tls_dir`` or a throwaway CA,
    and ``ca=<file>`` (what clients trust) is printed before ``bootstrap=``.
    """
    if admin_password is not None:
        from unlearn.infra.local.secured_kafka import SecuredLocalKafka

        secured = SecuredLocalKafka(nodes, admin_password=admin_password, tls_dir=tls_dir, port=port,
                                    data_dir=data_dir, settings=settings)
        cluster: LocalKafka = secured
    else:
        cluster = LocalKafka(nodes, port=port, data_dir=data_dir, settings=settings)

    def died() -> str | None:
        dead = [n for n in cluster.nodes if not n.running]
        return f"Kafka node {dead[0].node_id} exited unexpectedly:\n{dead[0].log_tail()}" if dead else None

    with stop_on_signal() as stop:
        try:
            cluster.start()
            for n in cluster.nodes:
                print(f"node={n.node_id} pid={n.pid} bootstrap={n.bootstrap}", flush=True)
            if admin_password is not None:
                print(f"ca={secured.ca_file}", flush=True)
            print(f"bootstrap={cluster.bootstrap}", flush=True)
            for n in cluster.nodes:
                print(f"node={n.node_id} log={n.log_path}", file=sys.stderr, flush=True)
            fields: dict[str, object] = {"engine": "kafka", "bootstrap": cluster.bootstrap, "nodes": nodes}
            if cluster.data_dir is not None:
                fields["data"] = str(cluster.data_dir)
            if admin_password is not None:
                fields["security"] = "SASL_SSL/SCRAM-SHA-512, controllers SSL (mTLS)"
            log_ready("broker", **fields)
            return watch_until_stopped(stop, died)
        finally:
            cluster.stop()
