"""The secured Kafka refuses what TLS must refuse, on a real broker (infra/local/secured_kafka.py):

- no port the broker process listens on answers a plaintext Kafka request (the client listener
  is SASL_SSL, the controller listener SSL), and a plaintext client's error says why;
- a client that trusts another CA refuses the broker, naming certificate verification;
- the controller listener refuses a client certificate from another CA, and one without any;
- the Java client reads the same properties file (clients/java ``KafkaSecurity``) and is refused
  the same way trusting another CA;
- a node moves to a new CA while clients trust both (docs/security.md, rotation).

One secured single-node cluster for the module; the rotation test starts its own.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from unlearn.infra.certificates import generate_tls_dir, issue, make_ca
from unlearn.infra.local.secured_kafka import SecuredLocalKafka
from unlearn.infra.settings import Settings
from unlearn.runtime.clients import admin_config

pytestmark = pytest.mark.broker

# ApiVersions v0, the first request every Kafka client sends: api key 18, correlation id 7.
_BODY = struct.pack(">hhih", 18, 0, 7, 4) + b"test"
API_VERSIONS = struct.pack(">i", len(_BODY)) + _BODY


@pytest.fixture(scope="module")
def cluster() -> Iterator[SecuredLocalKafka]:
    with SecuredLocalKafka(1, admin_password=f"admin-{uuid.uuid4().hex[:8]}") as kafka:
        yield kafka


def listening_ports(pid: int) -> set[int]:
    """Every TCP port process ``pid`` listens on (its socket inodes in /proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def plaintext_answer(host: str, port: int, timeout: float = 10.0) -> bytes:
    """What a listener sends back to a plaintext ApiVersions request (b"": it closed the connection)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(API_VERSIONS)
        got = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(4096)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            got += chunk
        return got


def test_no_plaintext_listener_answers(cluster: SecuredLocalKafka) -> None:
    (node,) = cluster.nodes
    assert node.pid is not None
    ports = listening_ports(node.pid)
    assert ports == {node.port, node.controller_port}  # nothing else listens
    for port in sorted(ports):
        got = plaintext_answer(node.host, port)
        # a Kafka answer starts with its length and our correlation id; a TLS listener answers
        # bytes that are not ApiVersions (at most an alert record) and closes
        assert got[4:8] != struct.pack(">i", 7), f"port {port} answered a plaintext ApiVersions request"


def _refusals(settings: Settings, caplog: pytest.LogCaptureFixture, timeout: float = 15.0) -> list[str]:
    """What the project's clients log (infra/connection_errors.py) while an admin client of
    ``settings`` fails to reach the cluster."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    caplog.clear()
    with caplog.at_level("ERROR", logger="unlearn.kafka"):
        admin = AdminClient(admin_config(settings))
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=timeout)
        admin.poll(2)  # serves the error callbacks, as a worker's poll loop does
    return [r.getMessage() for r in caplog.records if r.name == "unlearn.kafka"]


def _settings(cluster: SecuredLocalKafka, tmp_path: Path, body: str) -> Settings:
    path = tmp_path / f"{uuid.uuid4().hex[:8]}.properties"
    path.write_text(body)
    return Settings.from_env(bootstrap=cluster.bootstrap, profile="kafka", kafka_properties=str(path))


def test_a_plaintext_client_is_refused_and_told_why(cluster: SecuredLocalKafka, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    said = _refusals(_settings(cluster, tmp_path, "security.protocol=PLAINTEXT\n"), caplog)
    assert said == [f"kafka connection: the broker at {cluster.nodes[0].bootstrap} speaks TLS and this client's "
                    "security.protocol is PLAINTEXT: set security.protocol=SASL_SSL (or SSL) and ssl.ca.location in "
                    "the UNLEARN_KAFKA_PROPERTIES file (docs/security.md, \"TLS\")"], said


def test_a_client_trusting_another_ca_is_refused(cluster: SecuredLocalKafka, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    other = generate_tls_dir(tmp_path / "other", [1], ["127.0.0.1"])
    body = (f"security.protocol=SASL_SSL\nssl.ca.location={other.ca}\nsasl.mechanism=SCRAM-SHA-512\n"
            f"sasl.username=admin\nsasl.password={cluster.admin_password}\n")
    said = _refusals(_settings(cluster, tmp_path, body), caplog)
    assert said == [f"kafka connection: TLS refused: the broker's certificate is not signed by a CA this client "
                    f"trusts; this client trusts ssl.ca.location={other.ca} and verifies the host name "
                    f"(UNLEARN_KAFKA_PROPERTIES; docs/security.md, \"TLS\")"], said
    # the same file trusting the cluster's CA gets in: the CA is what was refused
    good = _settings(cluster, tmp_path, body.replace(str(other.ca), str(cluster.ca_file)))
    from confluent_kafka.admin import AdminClient

    assert AdminClient(admin_config(good)).list_topics(timeout=30).brokers


def _controller_refuses(cluster: SecuredLocalKafka, cert: tuple[Path, Path] | None) -> str:
    """Connect to the controller listener over TLS, trusting the cluster's CA, presenting ``cert``
    (certificate and key files) or none; returns how the listener refused."""
    (node,) = cluster.nodes
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    with socket.create_connection((node.host, node.controller_port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=node.host) as s:
        try:
            s.sendall(API_VERSIONS)  # TLS 1.3: the server judges the client certificate after the handshake
            got = s.recv(4096)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as exc:
            return f"{type(exc).__name__}: {exc}"
    raise AssertionError(f"the controller listener did not refuse: {got[:40]!r}")


def test_the_controllers_refuse_a_certificate_of_another_ca(cluster: SecuredLocalKafka, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    ca_key, ca_cert = make_ca("some other CA")
    key, cert = issue(ca_key, ca_cert, "unlearn-kafka-broker", ["127.0.0.1"])  # even the brokers' name
    (tmp_path / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "k.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    how = _controller_refuses(cluster, (tmp_path / "c.pem", tmp_path / "k.pem"))
    assert "SSLError" in how and "CERTIFICATE_UNKNOWN" in how, how  # Java's alert for an untrusted issuer
    how = _controller_refuses(cluster, None)
    assert "SSLError" in how and ("BAD_CERTIFICATE" in how or "CERTIFICATE_REQUIRED" in how), how


def test_the_java_client_reads_the_same_file_over_tls(cluster: SecuredLocalKafka, tmp_path: Path) -> None:
    """clients/java's KafkaSecurity turns the Python clients' properties file into its own
    settings: it gets in trusting the cluster's CA, and is refused, naming the certificate
    check, trusting another."""
    import subprocess

    from tests.clients.test_java import java_classpath

    cp = java_classpath(tmp_path)
    other = generate_tls_dir(tmp_path / "other", [1], ["127.0.0.1"])

    def probe(ca: Path) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "java.properties"
        path.write_text(f"security.protocol=SASL_SSL\nssl.ca.location={ca}\nsasl.mechanism=SCRAM-SHA-512\n"
                        f"sasl.username=admin\nsasl.password={cluster.admin_password}\n")
        env = {**os.environ, "UNLEARN_KAFKA_PROPERTIES": str(path)}
        return subprocess.run(["java", "-cp", cp, "dev.unlearn.client.TlsProbeMain", cluster.bootstrap], env=env,
                              capture_output=True, text=True, timeout=120)

    good = probe(cluster.ca_file)
    assert good.returncode == 0 and good.stdout.strip() == "ok nodes=1", good.stdout + good.stderr[-2000:]
    bad = probe(other.ca)
    assert bad.returncode == 1, bad.stdout + bad.stderr[-2000:]
    assert "SslAuthenticationException" in bad.stdout and "PKIX path" in bad.stdout, bad.stdout


def test_a_node_moves_to_a_new_ca_while_clients_trust_both(tmp_path: Path) -> None:
    """docs/security.md, "A new CA", on a real node: the operator's TLS directory trusts a bundle
    of the old and the new CA; the node restarts with a keystore of the new CA; a client trusting
    the bundle is served before and after, one trusting only the old CA is refused after."""
    from confluent_kafka.admin import AdminClient
    from cryptography.hazmat.primitives import serialization

    from unlearn.infra.certificates import BROKER_NAME, TlsDir, keystore_of

    tls = TlsDir(tmp_path / "tls")
    tls.path.mkdir()
    password = "rotation-test"
    tls.password_file.write_text(password)
    old_key, old_ca = make_ca("old CA")
    new_key, new_ca = make_ca("new CA")
    old_pem, new_pem = (tmp_path / "old.pem"), (tmp_path / "new.pem")
    old_pem.write_bytes(old_ca.public_bytes(serialization.Encoding.PEM))
    new_pem.write_bytes(new_ca.public_bytes(serialization.Encoding.PEM))
    tls.ca.write_bytes(old_pem.read_bytes() + new_pem.read_bytes())  # step 2: everyone trusts both
    key, cert = issue(old_key, old_ca, BROKER_NAME, ["127.0.0.1"])
    tls.node(1).write_bytes(keystore_of(key, cert, old_ca, password))
    admin_password = f"admin-{uuid.uuid4().hex[:8]}"

    def served(cluster: SecuredLocalKafka, ca: Path) -> bool:
        conf = {**cluster.client_config(), "ssl.ca.location": str(ca), "bootstrap.servers": cluster.bootstrap}
        try:
            return bool(AdminClient(conf).list_topics(timeout=15).brokers)
        except Exception:
            return False

    with SecuredLocalKafka(1, admin_password=admin_password, tls_dir=tls.path) as cluster:
        assert served(cluster, tls.ca) and served(cluster, old_pem) and not served(cluster, new_pem)
        key, cert = issue(new_key, new_ca, BROKER_NAME, ["127.0.0.1"])  # step 3: the same subject
        tls.node(1).write_bytes(keystore_of(key, cert, new_ca, password))
        cluster.stop_node(1)
        cluster.start_node(1)
        assert served(cluster, tls.ca) and served(cluster, new_pem) and not served(cluster, old_pem)
