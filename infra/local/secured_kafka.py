"""A local Apache Kafka secured as the compose deployment's broker: TLS, SASL/SCRAM and the authorizer.

``infra/kafka/broker.sh`` (the compose ``kafka`` service) runs one KRaft node whose client listener
is SASL_SSL with SCRAM-SHA-512 (brokers replicate over it too, as ``admin``), whose controller
listener is SSL with client certificates required (a node's certificate is its principal there),
whose authorizer is the StandardAuthorizer with ``allow.everyone.if.no.acl.found=false`` (nothing
is allowed without an ACL), and whose super users are ``admin`` (SCRAM, created at format time
with ``kafka-storage format --add-scram``: SCRAM users live in the cluster metadata, so the first
one can only come from there) and the nodes' certificate subject. No listener is plaintext; TLS
1.3 only. The certificates come from ``infra/certificates.py`` (a throwaway CA made at start,
or the operator's). :class:`SecuredLocalKafka` is a :class:`~unlearn.infra.local.kafka.LocalKafka`
with the same settings, so the tests run the deployment's init script (``infra/kafka/init.sh``: a
SCRAM user per service and the ACL matrix) against the broker the project runs, and the pipeline
with each service as its own principal (``tests/infra/test_secured_kafka.py``; a test keeps these
settings equal to broker.sh's).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from unlearn.infra.certificates import CertificateError, TlsDir, check_tls_dir, ensure_tls_dir
from unlearn.infra.local.kafka import LocalKafka
from unlearn.infra.local.kafka_jvm import KafkaNode
from unlearn.infra.local.tansu import BrokerError

__all__ = ["SCRAM_MECHANISM", "SECURITY_PROPERTIES", "SecuredLocalKafka"]

SCRAM_MECHANISM = "SCRAM-SHA-512"
"""The deployment's one SASL mechanism (broker.sh, the ``sasl.mechanism`` of docker-compose.yml's configs)."""

SECURITY_PROPERTIES: dict[str, str] = {
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "SASL_SSL",
    "listener.security.protocol.map": "CONTROLLER:SSL,SASL_SSL:SASL_SSL",
    "sasl.enabled.mechanisms": SCRAM_MECHANISM,
    "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
    "listener.name.controller.ssl.client.auth": "required",
    "ssl.keystore.type": "PKCS12",
    "ssl.truststore.type": "PEM",
    "ssl.endpoint.identification.algorithm": "https",
    "ssl.protocol": "TLSv1.3",
    "ssl.enabled.protocols": "TLSv1.3",
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "false",
    "super.users": "User:admin;User:CN=unlearn-kafka-broker,O=unlearn",
}
"""The security settings broker.sh writes, host- and port-independent (a test compares the two)."""

# A password goes into `SCRAM-SHA-512=[name=admin,password=...]` and a JAAS string: nothing that
# would end either (quote, comma, bracket, equals, whitespace, semicolon).
_PASSWORD = re.compile(r"[A-Za-z0-9._-]+")


def _jaas(user: str, password: str) -> str:
    return (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" '
            f'password="{password}";')


class SecuredLocalKafka(LocalKafka):
    """A LocalKafka whose listeners need TLS (and SCRAM, or a node certificate) and whose
    authorizer needs ACLs.

    ``admin_password`` is the super user ``admin``'s (created at format time; every other user is
    created over the admin API, by ``infra/kafka/init.sh``). The nodes' ``server.properties`` hold
    it and the keystore password, so they are written owner-only. ``tls_dir``: the operator's
    certificates (``infra/certificates.py`` layout), checked at start and never changed; without
    it a throwaway CA and keystores are made in the cluster's directory (``<dir>/tls``, kept with
    ``data_dir`` while valid, so a restarted cluster keeps its CA).
    """

    def __init__(self, nodes: int = 1, *, admin_password: str, tls_dir: str | os.PathLike[str] | None = None,
                 **kwargs: Any) -> None:
        if not _PASSWORD.fullmatch(admin_password):
            raise ValueError("admin_password: letters, digits, '.', '_' and '-' only (it goes into the "
                             "--add-scram argument and a JAAS string)")
        super().__init__(nodes, **kwargs)
        self.admin_password = admin_password
        self._tls_dir = Path(tls_dir).resolve() if tls_dir is not None else None
        self._tls: tuple[TlsDir, str] | None = None

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients must trust (``ssl.ca.location``)."""
        if self._tls is None:
            raise BrokerError("SecuredLocalKafka is not started")
        return self._tls[0].ca

    def _ensure_tls(self) -> tuple[TlsDir, str]:
        if self._tls is None:
            assert self._root is not None
            ids = [n.node_id for n in self.nodes]
            try:
                if self._tls_dir is not None:  # the operator's: checked, never regenerated
                    self._tls = (TlsDir(self._tls_dir), check_tls_dir(TlsDir(self._tls_dir), ids, [self.host]))
                else:
                    self._tls = ensure_tls_dir(self._root / "tls", ids, [self.host, "localhost"])
            except CertificateError as exc:
                raise BrokerError(f"TLS: {exc}") from None
        return self._tls

    def server_properties(self, node: KafkaNode) -> dict[str, str]:
        """LocalKafka's settings with the listeners, TLS, SASL and authorizer of broker.sh."""
        tls, subject = self._ensure_tls()
        password = tls.password()
        conf = super().server_properties(node)
        conf.update(SECURITY_PROPERTIES)
        conf["listeners"] = f"SASL_SSL://{self.host}:{node.port},CONTROLLER://{self.host}:{node.controller_port}"
        conf["advertised.listeners"] = f"SASL_SSL://{self.host}:{node.port}"
        conf[f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config"] = _jaas(
            "admin", self.admin_password)
        conf.update({"ssl.keystore.location": str(tls.node(node.node_id)), "ssl.keystore.password": password,
                     "ssl.key.password": password, "ssl.truststore.location": str(tls.ca),
                     "super.users": f"User:admin;User:{subject}"})
        conf.update(self._broker_config)  # the caller's overrides still win
        return conf

    def _prepare(self) -> None:
        super()._prepare()
        for n in self.nodes:  # server.properties holds the admin and keystore passwords
            os.chmod(n.dir / "server.properties", 0o600)

    def format_args(self) -> list[str]:
        """``--add-scram``: the super user's credential, in the metadata log from the start."""
        return ["--add-scram", f"{SCRAM_MECHANISM}=[name=admin,password={self.admin_password}]"]

    def client_config(self) -> dict[str, str]:
        """librdkafka settings of the super user (readiness probe, the init script's admin):
        SASL_SSL, trusting the cluster's CA, verifying the host name."""
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM_MECHANISM,
                "sasl.username": "admin", "sasl.password": self.admin_password,
                "ssl.ca.location": str(self.ca_file), "ssl.endpoint.identification.algorithm": "https"}
