#!/bin/bash
# Entry point of the compose `kafka` service (apache/kafka image): one KRaft node (broker and
# controller). No listener is plaintext: clients (and the broker, replicating as admin) use
# SASL_SSL with SCRAM-SHA-512; the controller listener is SSL with client certificates required,
# bound to localhost, and its principal (the node certificate's subject) is a super user. TLS 1.3
# only; clients verify the host name against the certificate. The StandardAuthorizer allows
# nothing without an ACL.
# Certificates: the compose `certs` service (`unlearn certs`, infra/certificates.py) leaves them
# in /unlearn-tls: ca.pem, node-1.p12, keystore.password; a throwaway CA unless the operator
# mounted their own (docs/security.md, "TLS").
# The super user `admin` gets its SCRAM credential at format time (kafka-storage --add-scram,
# KIP-900): SCRAM users live in the cluster metadata, so there is no other way to have the
# first one. Every other principal is created by infra/kafka/init.sh.
# Env: KAFKA_ADMIN_PASSWORD (required), KAFKA_CLUSTER_ID, KAFKA_ADVERTISED_HOST (default kafka),
# KAFKA_TLS_PRINCIPAL (the node certificate's subject; default: the generated one's).
set -euo pipefail
: "${KAFKA_ADMIN_PASSWORD:?set KAFKA_ADMIN_PASSWORD}"
CLUSTER_ID="${KAFKA_CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}"
HOST="${KAFKA_ADVERTISED_HOST:-kafka}"
TLS=/unlearn-tls
CONF=/tmp/unlearn-kafka/server.properties
mkdir -p /tmp/unlearn-kafka
jaas="org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"${KAFKA_ADMIN_PASSWORD}\";"
keystore_password="$(cat "$TLS/keystore.password")"
umask 077  # the files below hold the admin and keystore passwords
cat > "$CONF" <<PROPS
node.id=1
process.roles=broker,controller
controller.quorum.voters=1@localhost:9093
listeners=SASL_SSL://:9092,CONTROLLER://localhost:9093
advertised.listeners=SASL_SSL://${HOST}:9092
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=CONTROLLER:SSL,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=${jaas}
listener.name.controller.ssl.client.auth=required
ssl.keystore.type=PKCS12
ssl.keystore.location=${TLS}/node-1.p12
ssl.keystore.password=${keystore_password}
ssl.key.password=${keystore_password}
ssl.truststore.type=PEM
ssl.truststore.location=${TLS}/ca.pem
ssl.endpoint.identification.algorithm=https
ssl.protocol=TLSv1.3
ssl.enabled.protocols=TLSv1.3
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:${KAFKA_TLS_PRINCIPAL:-CN=unlearn-kafka-broker,O=unlearn}
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
security.protocol=SASL_SSL
ssl.truststore.type=PEM
ssl.truststore.location=${TLS}/ca.pem
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=${jaas}
PROPS
/opt/kafka/bin/kafka-storage.sh format --ignore-formatted --cluster-id "$CLUSTER_ID" --config "$CONF" \
    --add-scram "SCRAM-SHA-512=[name=admin,password=${KAFKA_ADMIN_PASSWORD}]"
exec /opt/kafka/bin/kafka-server-start.sh "$CONF"
