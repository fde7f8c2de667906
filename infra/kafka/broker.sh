#!/bin/bash
# Entry point of the compose `kafka` service (apache/kafka image): one KRaft node (broker and
# controller) with a SASL_PLAINTEXT (SCRAM-SHA-512) listener for every client and the
# StandardAuthorizer (nothing is allowed without an ACL). The controller listener is plaintext
# but bound to localhost, so only this container reaches it (its principal, User:ANONYMOUS, is a
# super user: the broker half authenticates to the controller half through it).
# The super user `admin` gets its SCRAM credential at format time (kafka-storage --add-scram,
# KIP-900): SCRAM users live in the cluster metadata, so there is no other way to have the
# first one. Every other principal is created by infra/kafka/init.sh.
# Env: KAFKA_ADMIN_PASSWORD (required), KAFKA_CLUSTER_ID, KAFKA_ADVERTISED_HOST (default kafka).
set -euo pipefail
: "${KAFKA_ADMIN_PASSWORD:?set KAFKA_ADMIN_PASSWORD}"
CLUSTER_ID="${KAFKA_CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}"
HOST="${KAFKA_ADVERTISED_HOST:-kafka}"
CONF=/tmp/unlearn-kafka/server.properties
mkdir -p /tmp/unlearn-kafka
jaas="org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"${KAFKA_ADMIN_PASSWORD}\";"
umask 077  # the files below hold the admin password
cat > "$CONF" <<PROPS
node.id=1
process.roles=broker,controller
controller.quorum.voters=1@localhost:9093
listeners=SASL_PLAINTEXT://:9092,CONTROLLER://localhost:9093
advertised.listeners=SASL_PLAINTEXT://${HOST}:9092
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=${jaas}
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:ANONYMOUS
log.dirs=/tmp/unlearn-kafka/data
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
# exact-ledger snapshots and posterior heads are large
message.max.bytes=104857600
replica.fetch.max.bytes=104857600
# topics are created explicitly, with their configs
auto.create.topics.enable=false
PROPS
# Client config of the super user, for the healthcheck and the init service's admin commands.
cat > /tmp/unlearn-kafka/admin.properties <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=${jaas}
PROPS
/opt/kafka/bin/kafka-storage.sh format --ignore-formatted --cluster-id "$CLUSTER_ID" --config "$CONF" \
    --add-scram "SCRAM-SHA-512=[name=admin,password=${KAFKA_ADMIN_PASSWORD}]"
exec /opt/kafka/bin/kafka-server-start.sh "$CONF"
