#!/bin/bash
# One-shot compose service `kafka-init`: a SCRAM-SHA-512 credential per service principal, then
# the ACL matrix (infra/kafka/acls.sh, generated from infra/acl_matrix.py). Idempotent: run it
# again to rotate passwords (kafka-configs --alter overwrites a user's credential) or after
# changing the matrix (kafka-acls --add of an existing rule is a no-op; it never removes one).
# Env: BOOTSTRAP (default kafka:9092), KAFKA_ADMIN_PASSWORD, UNLEARN_<PRINCIPAL>_PASSWORD for
# operator, featurizer, ledger, serving, verifier, client; UNLEARN_TOPIC_PREFIX.
set -euo pipefail
: "${KAFKA_ADMIN_PASSWORD:?set KAFKA_ADMIN_PASSWORD}"
export BOOTSTRAP="${BOOTSTRAP:-kafka:9092}"
export ADMIN_CONFIG=/tmp/admin.properties
here="$(cd "$(dirname "$0")" && pwd)"
umask 077
cat > "$ADMIN_CONFIG" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="${KAFKA_ADMIN_PASSWORD}";
PROPS
for user in operator featurizer ledger serving verifier client; do
    var="UNLEARN_$(echo "$user" | tr '[:lower:]' '[:upper:]')_PASSWORD"
    password="${!var:?set $var}"
    /opt/kafka/bin/kafka-configs.sh --bootstrap-server "$BOOTSTRAP" --command-config "$ADMIN_CONFIG" \
        --alter --entity-type users --entity-name "$user" \
        --add-config "SCRAM-SHA-512=[iterations=8192,password=${password}]" >/dev/null
    echo "scram: user $user"
done
sh "$here/acls.sh"
