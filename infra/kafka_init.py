"""``unlearn kafka-init``: a SCRAM user per service principal and the ACL matrix, on a secured Kafka.

The body of ``infra/kafka/init.sh``, which the compose ``kafka-init`` service runs and the tests
run against the project's own secured Kafka (``infra/local/secured_kafka.py``): one path, through the
Kafka admin API as the super user. It upserts a SCRAM credential for every principal of
:data:`~unlearn.infra.acl_matrix.PRINCIPALS` (run it again with new passwords to rotate them) and
creates one ALLOW binding per (grant, operation) of :data:`~unlearn.infra.acl_matrix.MATRIX` for the
deployment's topic prefix (creating an existing binding is a no-op; nothing is ever removed), then
reads the bindings back until every one is there (a KRaft broker serves them a moment after the
controller commits them) and fails if one is still missing after ``--timeout``.

Passwords come from the environment only (never argv, which ``ps`` shows): the super user's from
``KAFKA_ADMIN_PASSWORD``, each principal's from ``UNLEARN_<PRINCIPAL>_PASSWORD``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from unlearn.infra.acl_matrix import MATRIX, PRINCIPALS, Grant
from unlearn.infra.kafka_client import new_admin
from unlearn.infra.polling import poll_until

__all__ = ["InitError", "acl_bindings", "apply_acls", "kafka_init_main", "matrix_bindings_present", "set_users",
           "wait_for_bindings"]

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


class InitError(RuntimeError):
    """The broker refused or did not answer; the message says what and how to fix it."""


def acl_bindings(prefix: str, matrix: Sequence[Grant] = MATRIX) -> list[Any]:
    """The admin API's ALLOW bindings of the matrix for ``prefix``: one per grant and operation."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    kinds = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "cluster": ResourceType.BROKER}
    out = []
    for g in matrix:
        pattern = ResourcePatternType.LITERAL if g.resource == "cluster" or g.pattern == "literal" \
            else ResourcePatternType.PREFIXED
        for op in g.operations:
            out.append(AclBinding(kinds[g.resource], g.full_name(prefix), pattern, f"User:{g.principal}", "*",
                                  AclOperation[op], AclPermissionType.ALLOW))
    return out


def _result(futures: Mapping[Any, Any], what: str, timeout: float) -> None:
    failed = []
    for key, fut in futures.items():
        try:
            fut.result(timeout=timeout)
        except Exception as exc:  # KafkaException carrying the broker's error
            failed.append(f"{key}: {exc}")
    if failed:
        raise InitError(f"{what} failed for {len(failed)} of {len(futures)}:\n  " + "\n  ".join(failed[:10]))


def set_users(admin: Any, passwords: Mapping[str, str], mechanism: str = "SCRAM-SHA-512",
              iterations: int = 8192, timeout: float = 30.0) -> None:
    """Create or overwrite each user's SCRAM credential (``kafka-configs --alter --add-config``)."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    info = ScramCredentialInfo(ScramMechanism[mechanism.replace("-", "_")], iterations)
    ups = [UserScramCredentialUpsertion(user, info, password.encode()) for user, password in passwords.items()]
    _result(admin.alter_user_scram_credentials(ups, request_timeout=timeout), "SCRAM upsert", timeout)


def apply_acls(admin: Any, prefix: str, timeout: float = 30.0) -> int:
    """Create every binding of the matrix for ``prefix``; returns how many."""
    bindings = acl_bindings(prefix)
    _result(admin.create_acls(bindings, request_timeout=timeout), "create ACL", timeout)
    return len(bindings)


def matrix_bindings_present(admin: Any, prefix: str, timeout: float = 30.0) -> list[Any]:
    """The matrix's bindings for ``prefix`` the broker does not have (empty: all applied)."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    anything: Any = None  # a filter's wildcard (the library's annotations say str)
    every = AclBindingFilter(ResourceType.ANY, anything, ResourcePatternType.ANY, anything, anything,
                             AclOperation.ANY, AclPermissionType.ANY)
    have = set(admin.describe_acls(every, request_timeout=timeout).result(timeout=timeout))
    return [b for b in acl_bindings(prefix) if b not in have]


def wait_for_bindings(admin: Any, prefix: str, timeout: float) -> None:
    """Read the bindings back until all are there. ``create_acls`` returns once the controller has
    committed them; a KRaft broker serves them only after replaying its metadata log, which lags on
    a loaded machine (CI saw every binding missing on the first read). Raises after ``timeout``."""
    absent: list[Any] = []

    def applied(remaining: float) -> bool | None:
        absent[:] = matrix_bindings_present(admin, prefix, timeout=max(1.0, min(30.0, remaining)))
        return True if not absent else None

    poll_until(applied, timeout, interval=0.5, timed_out=lambda: InitError(
        f"{len(absent)} ACLs missing {timeout:.0f}s after creating them, e.g. {absent[0]}"))


def admin_client(bootstrap: str, password: str, *, user: str = "admin", mechanism: str = "SCRAM-SHA-512",
                 security_protocol: str = "SASL_SSL", ca_location: str | None = None, timeout: float = 60.0) -> Any:
    """An AdminClient of the super user, once the broker answers (the compose healthcheck can pass
    before a restarted broker has loaded its SCRAM users: retried up to ``timeout``). Over
    SASL_SSL it trusts ``ca_location`` (else the system's CAs) and verifies the host name."""
    conf: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap, "security.protocol": security_protocol,
                                  "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
                                  "log_level": 3}
    if security_protocol == "SASL_SSL":
        conf["ssl.endpoint.identification.algorithm"] = "https"
        if ca_location:
            conf["ssl.ca.location"] = ca_location
    admin = new_admin(conf)
    last: list[Exception] = []

    def answers(remaining: float) -> Any:
        try:
            admin.list_topics(timeout=min(10.0, max(1.0, remaining)))
            return admin
        except Exception as exc:
            last[:] = [exc]
            return None

    return poll_until(answers, timeout, interval=1.0, timed_out=lambda: InitError(
        f"no answer from {bootstrap} as {user} ({security_protocol}/{mechanism}) within {timeout:.0f}s: {last[0]}"))


def kafka_init_main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """``unlearn kafka-init [--bootstrap B] [--prefix P] [--mechanism M] [--iterations N]``."""
    env = os.environ if env is None else env
    ap = argparse.ArgumentParser(prog="unlearn kafka-init", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--bootstrap", default=env.get("BOOTSTRAP") or env.get("UNLEARN_BOOTSTRAP") or "kafka:9092",
                    help="the secured listener (default: $BOOTSTRAP, $UNLEARN_BOOTSTRAP, kafka:9092)")
    ap.add_argument("--prefix", default=env.get("UNLEARN_TOPIC_PREFIX") or "unlearn.",
                    help="the deployment's topic prefix (default: $UNLEARN_TOPIC_PREFIX or unlearn.)")
    ap.add_argument("--admin-user", default=env.get("KAFKA_ADMIN_USER") or "admin")
    ap.add_argument("--mechanism", choices=MECHANISMS, default="SCRAM-SHA-512")
    ap.add_argument("--security-protocol", choices=("SASL_PLAINTEXT", "SASL_SSL"), default="SASL_SSL")
    ap.add_argument("--ssl-ca-location", default=env.get("KAFKA_SSL_CA_LOCATION") or None, metavar="FILE",
                    help="SASL_SSL: the CA that signed the broker's certificate (default: $KAFKA_SSL_CA_LOCATION, "
                    "else the system's CAs)")
    ap.add_argument("--iterations", type=int, default=8192, help="SCRAM iterations (Kafka's minimum is 4096)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the broker")
    args = ap.parse_args(argv)
    missing = [v for v in ("KAFKA_ADMIN_PASSWORD", *(f"UNLEARN_{p.upper()}_PASSWORD" for p in PRINCIPALS))
               if not env.get(v)]
    if missing:
        print(f"unlearn kafka-init: set {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        admin = admin_client(args.bootstrap, env["KAFKA_ADMIN_PASSWORD"], user=args.admin_user,
                             mechanism=args.mechanism, security_protocol=args.security_protocol,
                             ca_location=args.ssl_ca_location, timeout=args.timeout)
        set_users(admin, {p: env[f"UNLEARN_{p.upper()}_PASSWORD"] for p in PRINCIPALS},
                  args.mechanism, args.iterations)
        print(f"scram: {args.mechanism} users {' '.join(PRINCIPALS)}", flush=True)
        n = apply_acls(admin, args.prefix)
        wait_for_bindings(admin, args.prefix, args.timeout)
    except InitError as exc:
        print(f"unlearn kafka-init: {exc}", file=sys.stderr)
        return 1
    print(f"acls: {len(MATRIX)} rules ({n} bindings) for prefix {args.prefix}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(kafka_init_main())
