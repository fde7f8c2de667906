"""A local Apache Kafka secured as the compose deployment's broker: SASL/SCRAM and the authorizer.

``infra/kafka/broker.sh`` (the compose ``kafka`` service) runs one KRaft node whose client listener
is SASL_PLAINTEXT with SCRAM-SHA-512, whose authorizer is the StandardAuthorizer with
``allow.everyone.if.no.acl.found=false`` (nothing is allowed without an ACL), whose super users are
``admin`` (SCRAM, created at format time with ``kafka-storage format --add-scram``: SCRAM users live
in the cluster metadata, so the first one can only come from there) and ``ANONYMOUS`` (the
plaintext controller listener, on loopback only). :class:`SecuredLocalKafka` is a
:class:`~unlearn.infra.kafka_broker.LocalKafka` with the same settings, so the tests run the
deployment's init script (``infra/kafka/init.sh``: a SCRAM user per service and the ACL matrix)
against the broker the project runs, and the pipeline with each service as its own principal
(``tests/infra/test_secured_kafka.py``; a test keeps these settings equal to broker.sh's).
"""

from __future__ import annotations

import os
import re
from typing import Any

from unlearn.infra.kafka_broker import KafkaNode, LocalKafka

__all__ = ["SCRAM_MECHANISM", "SECURITY_PROPERTIES", "SecuredLocalKafka"]

SCRAM_MECHANISM = "SCRAM-SHA-512"
"""The deployment's one SASL mechanism (broker.sh, the ``sasl.mechanism`` of docker-compose.yml's configs)."""

SECURITY_PROPERTIES: dict[str, str] = {
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "SASL_PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
    "sasl.enabled.mechanisms": SCRAM_MECHANISM,
    "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "false",
    "super.users": "User:admin;User:ANONYMOUS",
}
"""The security settings broker.sh writes, host- and port-independent (a test compares the two)."""

# A password goes into `SCRAM-SHA-512=[name=admin,password=...]` and a JAAS string: nothing that
# would end either (quote, comma, bracket, equals, whitespace, semicolon).
_PASSWORD = re.compile(r"[A-Za-z0-9._-]+")


def _jaas(user: str, password: str) -> str:
    return (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" '
            f'password="{password}";')


class SecuredLocalKafka(LocalKafka):
    """A LocalKafka whose client listener needs SCRAM and whose authorizer needs ACLs.

    ``admin_password`` is the super user ``admin``'s (created at format time; every other user is
    created over the admin API, by ``infra/kafka/init.sh``). The nodes' ``server.properties`` hold
    it (the broker authenticates to itself as admin), so they are written owner-only.
    """

    def __init__(self, nodes: int = 1, *, admin_password: str, **kwargs: Any) -> None:
        if not _PASSWORD.fullmatch(admin_password):
            raise ValueError("admin_password: letters, digits, '.', '_' and '-' only (it goes into the "
                             "--add-scram argument and a JAAS string)")
        super().__init__(nodes, **kwargs)
        self.admin_password = admin_password

    def server_properties(self, node: KafkaNode) -> dict[str, str]:
        """LocalKafka's settings with the listener, SASL and authorizer of broker.sh."""
        conf = super().server_properties(node)
        conf.update(SECURITY_PROPERTIES)
        conf["listeners"] = f"SASL_PLAINTEXT://{self.host}:{node.port},CONTROLLER://{self.host}:{node.controller_port}"
        conf["advertised.listeners"] = f"SASL_PLAINTEXT://{self.host}:{node.port}"
        conf[f"listener.name.sasl_plaintext.{SCRAM_MECHANISM.lower()}.sasl.jaas.config"] = _jaas(
            "admin", self.admin_password)
        conf.update(self._broker_config)  # the caller's overrides still win
        return conf

    def _prepare(self) -> None:
        super()._prepare()
        for n in self.nodes:  # server.properties holds the admin password
            os.chmod(n.dir / "server.properties", 0o600)

    def format_args(self) -> list[str]:
        """``--add-scram``: the super user's credential, in the metadata log from the start."""
        return ["--add-scram", f"{SCRAM_MECHANISM}=[name=admin,password={self.admin_password}]"]

    def client_config(self) -> dict[str, str]:
        """librdkafka settings of the super user (readiness probe, the init script's admin)."""
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": SCRAM_MECHANISM,
                "sasl.username": "admin", "sasl.password": self.admin_password}
