"""The secured compose deployment, checked statically (no Docker engine here; what it runs is run
for real, without Docker, by tests/infra/test_secured_kafka.py). The file parses; every worker
runs as its own principal, from its own Kafka client properties file (a compose config mounted
where ``UNLEARN_KAFKA_PROPERTIES`` points) over SASL_SSL, trusting the CA the ``certs`` service
makes; the init service creates exactly the matrix's principals; the broker script has no
plaintext listener and turns the authorizer on; and each service's environment and file, run
through the typed settings and ``infra.settings``, give its librdkafka clients the SASL and TLS
config (shown in docs/security.md)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from unlearn.infra.acl_matrix import PRINCIPALS, grants_of
from unlearn.infra.certificates import generate_tls_dir
from unlearn.infra.kafka_properties import client_security, read_properties
from unlearn.infra.settings import SecuritySettings, Settings, security_config
from unlearn.runtime.clients import admin_config, consumer_config, producer_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
CONFIGS: dict[str, Any] = COMPOSE["configs"]
WORKERS = {name: svc for name, svc in SERVICES.items()
           if svc.get("build", {}).get("dockerfile") == "infra/Dockerfile" and name not in ("kafka-init", "certs")}
CA_MOUNT = "/etc/unlearn/ca"  # where the kafka-ca volume (ca.pem, made by `certs`) is mounted
# Which principal each compose service runs as.
PRINCIPAL_OF = {"topics": "operator", "operator": "operator", "featurizer": "featurizer", "ledger": "ledger",
                "serve": "serving", "verifier": "verifier", "client": "client"}
# `unlearn cdc` (principal cdc) is not a compose service: the worker image has no JVM and no Connect
# jars, so it runs on a host with its own properties file (docs/cdc.md); kafka-init creates its user.
HOST_ONLY = {"cdc"}
_VAR = re.compile(r"\$\{([A-Z0-9_]+):-([^}]*)\}")


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}``: the variable if set and non-empty, else the default."""
    return _VAR.sub(lambda m: env.get(m.group(1)) or m.group(2), str(value))


def _environment(service: str, env: dict[str, str] | None = None) -> dict[str, str]:
    raw = SERVICES[service]["environment"]
    assert isinstance(raw, dict), f"{service}: use the mapping form (anchors merge into it)"
    return {k: _interpolate(v, env or {}) for k, v in raw.items()}


def _properties(service: str, directory: Path, env: dict[str, str] | None = None) -> tuple[str, Path]:
    """The config ``service`` mounts at its ``UNLEARN_KAFKA_PROPERTIES``: its name, and its
    interpolated content written to ``directory`` (as compose writes it into the container)."""
    (mount,) = SERVICES[service]["configs"]
    assert mount["target"] == _environment(service)["UNLEARN_KAFKA_PROPERTIES"], service
    assert f"kafka-ca:{CA_MOUNT}:ro" in SERVICES[service]["volumes"], service
    ca = directory / "ca"  # the volume, here
    if not (ca / "ca.pem").exists():
        generate_tls_dir(ca, [1], ["kafka"])
    path = directory / f"{service}.properties"
    path.write_text(_interpolate(CONFIGS[mount["source"]]["content"], env or {}).replace(CA_MOUNT, str(ca)))
    return mount["source"], path


def test_every_worker_runs_as_its_own_principal(tmp_path: Path) -> None:
    assert set(WORKERS) == set(PRINCIPAL_OF)
    assert {PRINCIPAL_OF[w] for w in WORKERS} == set(PRINCIPALS) - HOST_ONLY
    assert set(CONFIGS) == {f"kafka-{p}" for p in PRINCIPALS if p not in HOST_ONLY}  # one file per principal
    for name in WORKERS:
        env = _environment(name)
        assert env["UNLEARN_PROFILE"] == "kafka"
        assert env["UNLEARN_BOOTSTRAP"] == "kafka:9092"
        assert not {k for k in env if k.startswith(("UNLEARN_SASL", "UNLEARN_SSL", "UNLEARN_SECURITY"))}
        user = PRINCIPAL_OF[name]
        source, path = _properties(name, tmp_path)
        assert source == f"kafka-{user}"
        assert client_security(str(path)) == {
            "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
            "sasl.password": f"{user}-local-only", "ssl.ca.location": str(tmp_path / "ca" / "ca.pem"),
            "ssl.endpoint.identification.algorithm": "https"}
        assert f"sasl.password=${{UNLEARN_{user.upper()}_PASSWORD:-{user}-local-only}}" in \
            CONFIGS[source]["content"].splitlines(), name


def test_init_service_creates_every_principal_with_the_workers_passwords(tmp_path: Path) -> None:
    init = SERVICES["kafka-init"]
    assert init["depends_on"] == {"kafka": {"condition": "service_healthy"}}
    assert SERVICES["topics"]["depends_on"] == {"kafka-init": {"condition": "service_completed_successfully"}}
    for name in WORKERS:
        if name != "topics":
            assert SERVICES[name]["depends_on"] == {"topics": {"condition": "service_completed_successfully"}}
    for user in PRINCIPALS:
        var = f"UNLEARN_{user.upper()}_PASSWORD"
        assert init["environment"][var] == f"${{{var}:-{user}-local-only}}"
    # the worker image runs the script of the checkout (COPY . .), which calls `unlearn kafka-init`
    assert init["build"] == {"context": ".", "dockerfile": "infra/Dockerfile"}
    assert init["entrypoint"] == ["/bin/bash", "/app/infra/kafka/init.sh"]
    assert init["environment"]["KAFKA_SSL_CA_LOCATION"] == f"{CA_MOUNT}/ca.pem"
    assert f"kafka-ca:{CA_MOUNT}:ro" in init["volumes"]
    script = (ROOT / "infra/kafka/init.sh").read_text()
    (loop,) = re.findall(r"^for user in ([a-z ]+); do$", script, re.M)
    assert loop.split() == list(PRINCIPALS)
    assert re.search(r'^exec "\$\{UNLEARN_CLI:-unlearn\}" kafka-init .*--security-protocol SASL_SSL '
                     r'--mechanism SCRAM-SHA-512$', script, re.M)
    # an overridden password reaches both the init service and the worker
    env = {"UNLEARN_LEDGER_PASSWORD": "rotated-2027"}
    assert _environment("kafka-init", env)["UNLEARN_LEDGER_PASSWORD"] == "rotated-2027"
    _, path = _properties("ledger", tmp_path, env)
    assert read_properties(str(path))["sasl.password"].value == "rotated-2027"


def test_broker_requires_tls_scram_and_acls() -> None:
    kafka = SERVICES["kafka"]
    from unlearn.infra.certificates import BROKER_NAME
    from unlearn.infra.local.kafka_jvm import kafka_version

    assert kafka["image"] == f"apache/kafka:{kafka_version()}"  # the broker the tests run
    assert kafka["entrypoint"] == ["/bin/bash", "/unlearn-kafka/broker.sh"]
    assert kafka["volumes"] == ["./infra/kafka:/unlearn-kafka:ro", "kafka-tls:/unlearn-tls:ro"]
    assert kafka["depends_on"] == {"certs": {"condition": "service_completed_successfully"}}
    certs = SERVICES["certs"]["command"]  # the keystore for the names the broker is dialled by
    assert certs[:3] == ["certs", "--dir", "/tls"] and {"kafka", "localhost"} <= set(certs)
    assert SERVICES["certs"]["volumes"] == ["kafka-tls:/tls", "kafka-ca:/ca"] and "/ca/ca.pem" in certs
    assert kafka["ports"] == ["9092:9092"]  # the SASL_SSL listener only; the controller stays inside
    assert "--command-config /tmp/unlearn-kafka/admin.properties" in kafka["healthcheck"]["test"][1]
    script = (ROOT / "infra/kafka/broker.sh").read_text()
    props = dict(line.split("=", 1) for line in script.splitlines()
                 if re.match(r"^[a-z][a-z0-9._-]*=", line) and not line.startswith(("jaas=", "umask", "keystore_")))
    assert props["listeners"] == "SASL_SSL://:9092,CONTROLLER://localhost:9093"  # no plaintext listener
    assert props["listener.security.protocol.map"] == "CONTROLLER:SSL,SASL_SSL:SASL_SSL"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert props["ssl.endpoint.identification.algorithm"] == "https"
    assert props["ssl.enabled.protocols"] == "TLSv1.3"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    # the node certificate's subject: the controller listener's principal (no ANONYMOUS super user)
    assert props["super.users"] == "User:admin;User:${KAFKA_TLS_PRINCIPAL:-CN=" + BROKER_NAME + ",O=unlearn}"
    assert "PLAINTEXT" not in script
    assert props["controller.quorum.voters"] == "1@localhost:9093"
    assert props["auto.create.topics.enable"] == "false"
    assert "admin" not in PRINCIPALS  # the super user is not a service principal


def _settings_of(service: str, monkeypatch: pytest.MonkeyPatch, directory: Path) -> Settings:
    for k in list(os.environ):
        if k.startswith("UNLEARN_") or k == "KAFKA_BOOTSTRAP":
            monkeypatch.delenv(k)
    for k, v in _environment(service).items():
        monkeypatch.setenv(k, v)
    _, path = _properties(service, directory)
    monkeypatch.setenv("UNLEARN_KAFKA_PROPERTIES", str(path))  # where compose mounts it, here
    return Settings.from_env()


@pytest.mark.parametrize("service", sorted(PRINCIPAL_OF))
def test_each_service_gets_its_librdkafka_security_config(service: str, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    s = _settings_of(service, monkeypatch, tmp_path)
    user = PRINCIPAL_OF[service]
    want = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
            "sasl.password": f"{user}-local-only", "ssl.ca.location": str(tmp_path / "ca" / "ca.pem"),
            "ssl.endpoint.identification.algorithm": "https"}
    assert security_config(s) == want
    for conf in (producer_config(s), consumer_config(s, "g"), admin_config(s)):
        assert {k: conf[k] for k in want} == want and conf["bootstrap.servers"] == "kafka:9092"
    assert f"{user}-local-only" not in repr(s) and f"{user}-local-only" not in repr(SecuritySettings.of(s))
    assert grants_of(user)  # and the matrix grants that principal something


def test_passwords_fit_the_scram_and_jaas_syntax() -> None:
    """The defaults (and any documented override) must not break `SCRAM-SHA-512=[password=...]`
    or the JAAS string: no quote, comma, bracket, equals sign or whitespace."""
    defaults = _VAR.findall((ROOT / "docker-compose.yml").read_text())
    assert defaults
    for var, default in defaults:
        if var.endswith("_PASSWORD"):
            assert re.fullmatch(r"[A-Za-z0-9._-]+", default), (var, default)
