"""The project's Apache Kafka (infra/local/kafka.py) on the real broker: one node, three nodes
losing one to kill -9 under acks=all, a restart of the whole cluster from its data dirs, the CLI,
and clear errors when the jars or java are missing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.process_support import alive, wait_dead
from unlearn.infra.local import kafka as kafka_broker
from unlearn.infra.local import kafka_jvm
from unlearn.infra.local.kafka import LocalKafka
from unlearn.infra.local.kafka_jvm import JavaNotFound, KafkaJarsMissing
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import consumer_config, producer_config

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]






def _settings(bootstrap: str) -> Settings:
    return Settings.from_env(bootstrap=bootstrap, profile="kafka")


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, -1)])[topic].result(30)


def _produce(settings: Settings, topic: str, values: range) -> None:
    """acks=all and idempotence (the kafka profile); every record must be acknowledged."""
    producer = Producer(producer_config(settings, **{"delivery.timeout.ms": 60000}))
    errors: list[str] = []
    for i in values:
        producer.produce(topic, key=str(i % 7).encode(), value=str(i).encode(),
                         on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
        producer.poll(0)
    assert producer.flush(90) == 0
    assert errors == []


def _consume(settings: Settings, topic: str, group: str, want: int, commit: bool = True) -> list[int]:
    consumer = Consumer(consumer_config(settings, group))
    consumer.subscribe([topic])
    seen: list[int] = []
    deadline = time.monotonic() + 60
    try:
        while len(seen) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            seen.append(int(msg.value()))
        if commit and seen:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return seen


def _committed(settings: Settings, topic: str, group: str, partitions: int) -> int:
    consumer = Consumer(consumer_config(settings, group))
    try:
        offsets = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        consumer.close()
    return sum(max(tp.offset, 0) for tp in offsets)


def test_one_node_produces_consumes_and_cleans_up() -> None:
    cluster = LocalKafka(1)
    with cluster:
        node = cluster.nodes[0]
        assert cluster.bootstrap == node.bootstrap == f"127.0.0.1:{node.port}"
        assert node.pid is not None and alive(node.pid)
        settings = _settings(cluster.bootstrap)
        _create(cluster.bootstrap, "t1", 3)
        _produce(settings, "t1", range(200))
        assert sorted(_consume(settings, "t1", "g1", 200)) == list(range(200))
        # Real Kafka: an unknown topic is not created behind our back.
        md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics("nope", timeout=10)
        assert md.topics["nope"].error is not None
        pid, data = node.pid, node.data_path
    assert wait_dead(pid, 15.0)
    assert not data.exists(), "a temporary cluster's data is deleted on stop"
    assert node.log_path.exists(), "its log stays for diagnosis"


def test_three_nodes_ride_through_a_kill_and_restart_from_their_data_dirs(tmp_path: Path) -> None:
    data = tmp_path / "kafka"
    cluster = LocalKafka(3, data_dir=data)
    cluster.start()
    try:
        ports = [n.port for n in cluster.nodes]
        settings = _settings(cluster.bootstrap)
        _create(cluster.bootstrap, "events", 4)
        desc = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics("events", timeout=10)
        assert all(len(p.replicas) == 3 for p in desc.topics["events"].partitions.values())
        _produce(settings, "events", range(0, 300))
        # The group (and so __consumer_offsets, replicated 3 times) exists before a node dies:
        # with one node gone Kafka cannot create an internal topic of replication factor 3.
        assert sorted(_consume(settings, "events", "readers", 300)) == list(range(300))

        victim = cluster.node(2)
        pid = victim.pid
        assert pid is not None
        cluster.kill_node(2)
        assert wait_dead(pid, 5)
        # min.insync.replicas=2: acks=all still succeeds with two of three nodes.
        _produce(settings, "events", range(300, 600))
        assert sorted(_consume(settings, "events", "readers", 300)) == list(range(300, 600))

        node = cluster.start_node(2)
        assert node.running and node.pid != pid and node.port == ports[1]
        _produce(settings, "events", range(600, 700))
        cluster.stop()
        assert not any(n.running for n in cluster.nodes)

        again = LocalKafka(3, data_dir=data)
        with again:
            assert [n.port for n in again.nodes] == ports, "ports are kept in the data dir"
            assert again.cluster_id == cluster.cluster_id
            settings = _settings(again.bootstrap)
            assert _committed(settings, "events", "readers", 4) == 600
            assert sorted(_consume(settings, "events", "fresh", 700, commit=False)) == list(range(700))
            assert sorted(_consume(settings, "events", "readers", 100)) == list(range(600, 700))
    finally:
        cluster.kill()


def test_a_picked_port_taken_before_the_jvm_binds_it_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """free_port's answer can be stale by the time Kafka binds: the start tries new ports."""
    import socket

    real = kafka_broker.free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picked: list[int] = []

        def stale_first(host: str) -> int:
            picked.append(busy if not picked else real(host))
            return picked[-1]

        monkeypatch.setattr(kafka_broker, "free_port", stale_first)
        with LocalKafka(1) as cluster:
            assert cluster.nodes[0].port != busy
        assert len(picked) == 4, "client and controller port, twice: the first start lost its port"


def test_a_data_dir_of_another_size_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text('{"cluster_id": "x", "nodes": 3, "ports": []}')
    with pytest.raises(kafka_broker.BrokerError, match="3-node cluster"):
        LocalKafka(1, data_dir=tmp_path).start()


def test_missing_jars_say_run_make_kafka(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_jvm, "_CHECKOUT", tmp_path)
    with pytest.raises(KafkaJarsMissing, match="make kafka"):
        LocalKafka(1, settings=Settings()).start()
    with pytest.raises(KafkaJarsMissing, match=r"no kafka_2\.13"):
        LocalKafka(1, settings=Settings().with_(kafka_jars=str(tmp_path))).start()


def test_missing_java_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFound, match="JAVA_HOME"):
        LocalKafka(1).start()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "unlearn.services.cli", "broker", "--engine", "kafka", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_cli_prints_each_node_and_never_outlives_itself(tmp_path: Path, how: str) -> None:
    """`unlearn broker --engine kafka --nodes 2`: one `node= pid= bootstrap=` line per node, then
    `bootstrap=`; SIGTERM stops the nodes (exit 0); a SIGKILLed CLI takes them with it."""
    child = _cli("--nodes", "2", "--data", str(tmp_path / "d"))
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline().strip() for _ in range(3)]
        found = [re.fullmatch(r"node=(\d) pid=(\d+) bootstrap=(127\.0\.0\.1:\d+)", line) for line in lines[:2]]
        assert all(found), lines
        pids = [int(m.group(2)) for m in found if m]
        assert lines[2] == "bootstrap=" + ",".join(m.group(3) for m in found if m)
        assert all(alive(p) for p in pids)
        producer = Producer({"bootstrap.servers": lines[2].removeprefix("bootstrap=")})
        assert producer.list_topics(timeout=10).brokers.keys() == {1, 2}
        if how == "sigterm":
            child.send_signal(signal.SIGTERM)
            _, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            assert "unlearn broker ready engine='kafka'" in err
        else:
            child.kill()
            child.wait()
        assert all(wait_dead(p, 15.0) for p in pids)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()


def test_cli_without_jars_exits_2_saying_make_kafka(tmp_path: Path) -> None:
    env = {**os.environ, "UNLEARN_KAFKA_JARS": str(tmp_path)}
    child = _cli(env=env)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 2
    assert "error:" in err and "kafka_2.13" in err


def test_tansu_stays_the_default_engine_and_refuses_nodes() -> None:
    child = subprocess.run([sys.executable, "-m", "unlearn.services.cli", "broker", "--nodes", "3"],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 2 and "--nodes needs --engine kafka" in child.stderr


def test_kafka_profile_produces_idempotently() -> None:
    """The kafka client profile keeps idempotence on (Kafka's own dedupe of retried batches)."""
    conf = producer_config(_settings("127.0.0.1:1"))
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert "max.in.flight.requests.per.connection" not in conf
