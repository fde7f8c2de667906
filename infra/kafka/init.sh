#!/bin/bash
# One-shot compose service `kafka-init` (the worker image): a SCRAM-SHA-512 credential per service
# principal, then the ACL matrix of infra/acl_matrix.py, through the Kafka admin API as the super
# user (`unlearn kafka-init`, infra/kafka_init.py). The tests run this same script against the
# project's own secured Kafka (tests/infra/test_secured_kafka.py). Idempotent: run it again to
# rotate passwords (a user's credential is overwritten) or after changing the matrix (creating an
# existing ACL is a no-op; it never removes one).
# Over SASL_SSL, trusting the CA in KAFKA_SSL_CA_LOCATION and verifying the broker's host name.
# Env: BOOTSTRAP (default kafka:9092), KAFKA_ADMIN_PASSWORD, KAFKA_SSL_CA_LOCATION, UNLEARN_<PRINCIPAL>_PASSWORD for
# operator, featurizer, ledger, serving, verifier, client, cdc; UNLEARN_TOPIC_PREFIX (default unlearn.);
# UNLEARN_CLI (default: unlearn on PATH).
set -euo pipefail
: "${KAFKA_ADMIN_PASSWORD:?set KAFKA_ADMIN_PASSWORD}"
for user in operator featurizer ledger serving verifier client cdc; do
    var="UNLEARN_$(echo "$user" | tr '[:lower:]' '[:upper:]')_PASSWORD"
    : "${!var:?set $var}"
done
exec "${UNLEARN_CLI:-unlearn}" kafka-init --bootstrap "${BOOTSTRAP:-kafka:9092}" --security-protocol SASL_SSL --mechanism SCRAM-SHA-512
