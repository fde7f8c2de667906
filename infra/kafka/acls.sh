#!/bin/sh
# GENERATED from infra/acl_matrix.py by `unlearn acls script`; do not edit (a test compares).
# Env: BOOTSTRAP (broker), ADMIN_CONFIG (client properties of a super user),
#      UNLEARN_TOPIC_PREFIX (default unlearn.), KAFKA_BIN (default /opt/kafka/bin).
set -eu
P="${UNLEARN_TOPIC_PREFIX:-unlearn.}"
PATH="${KAFKA_BIN:-/opt/kafka/bin}:$PATH"
# operator: `unlearn topics create|list`; deleting superseded or test topics
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:operator --operation Create --operation Delete --operation Describe --operation DescribeConfigs --topic "${P}" --resource-pattern-type PREFIXED >/dev/null
# operator: `unlearn heads create|extend|show|list`
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:operator --operation Read --operation Write --topic "${P}head-registry" --resource-pattern-type LITERAL >/dev/null
# operator: `unlearn clients ...`: whoever writes it grants rights
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:operator --operation Read --operation Write --topic "${P}client-registry" --resource-pattern-type LITERAL >/dev/null
# operator: registry readers' group ids; deleting a stale worker group
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:operator --operation Read --operation Delete --group "${P}" --resource-pattern-type PREFIXED >/dev/null
# operator: cluster metadata
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:operator --operation Describe --cluster >/dev/null
# featurizer: its input
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --topic "${P}requests" --resource-pattern-type LITERAL >/dev/null
# featurizer: its repartition topic (created at start if missing: `ensure_topic`)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --operation Write --operation Create --topic "${P}requests.by-head" --resource-pattern-type LITERAL >/dev/null
# featurizer: the feature cache's changelog
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --operation Write --topic "${P}featurizer-cache" --resource-pattern-type LITERAL >/dev/null
# featurizer: contracts; auto-created heads
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --operation Write --topic "${P}head-registry" --resource-pattern-type LITERAL >/dev/null
# featurizer: signed requests: keys and rights
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --topic "${P}client-registry" --resource-pattern-type LITERAL >/dev/null
# featurizer: its output (read: log ends, for keys awaiting destruction)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --operation Write --topic "${P}deltas" --resource-pattern-type LITERAL >/dev/null
# featurizer: rejected deletes
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Write --topic "${P}receipts" --resource-pattern-type LITERAL >/dev/null
# featurizer: refused requests
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Write --topic "${P}deadletter" --resource-pattern-type LITERAL >/dev/null
# featurizer: the subject-keys family it creates and rotates
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --operation Write --operation Create --operation Delete --topic "${P}subject-keys." --resource-pattern-type PREFIXED >/dev/null
# featurizer: the private halves of its transit keys: a family it creates and rotates
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --operation Write --operation Create --operation Delete --topic "${P}transit-private." --resource-pattern-type PREFIXED >/dev/null
# featurizer: the public halves of its transit keys
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Write --operation Create --topic "${P}transit-keys" --resource-pattern-type LITERAL >/dev/null
# featurizer: the ledger's checkpoint floors: when a deleted sample's key may be destroyed
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --topic "${P}ledger-state." --resource-pattern-type PREFIXED >/dev/null
# featurizer: its group `P featurizer` (`.client` when federated) and `P featurizer-restore-*`
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --group "${P}featurizer" --resource-pattern-type PREFIXED >/dev/null
# featurizer: head-registry follower
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --group "${P}registry-" --resource-pattern-type PREFIXED >/dev/null
# featurizer: client-registry follower
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --group "${P}clients-" --resource-pattern-type PREFIXED >/dev/null
# featurizer: log-end probe (`infra/log_position.py`)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:featurizer --operation Read --group "${P}log-probe" --resource-pattern-type LITERAL >/dev/null
# ledger: its input
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Read --topic "${P}deltas" --resource-pattern-type LITERAL >/dev/null
# ledger: applied deletes
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Write --topic "${P}receipts" --resource-pattern-type LITERAL >/dev/null
# ledger: refused deltas
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Write --topic "${P}deadletter" --resource-pattern-type LITERAL >/dev/null
# ledger: a new head's gamma from its contract
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Read --topic "${P}head-registry" --resource-pattern-type LITERAL >/dev/null
# ledger: its state generations (created and rotated by the ledger)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Read --operation Write --operation Create --operation Delete --topic "${P}ledger-state." --resource-pattern-type PREFIXED >/dev/null
# ledger: head-update generations (created and rotated by the ledger)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Read --operation Write --operation Create --operation Delete --topic "${P}heads." --resource-pattern-type PREFIXED >/dev/null
# ledger: the subject-keys family
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Read --topic "${P}subject-keys." --resource-pattern-type PREFIXED >/dev/null
# ledger: at start it ensures every project topic exists (`create_topics`)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Describe --topic "${P}requests" --resource-pattern-type LITERAL >/dev/null
# ledger: at start it ensures every project topic exists (`create_topics`); its partition count names a head's key partition (`streams/ledger/unseal.py`)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Describe --topic "${P}requests.by-head" --resource-pattern-type LITERAL >/dev/null
# ledger: at start it ensures every project topic exists (`create_topics`)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Describe --topic "${P}featurizer-cache" --resource-pattern-type LITERAL >/dev/null
# ledger: at start it ensures every project topic exists (`create_topics`)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Describe --topic "${P}client-registry" --resource-pattern-type LITERAL >/dev/null
# ledger: at start it ensures every project topic exists (`create_topics`)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Describe --topic "${P}transit-keys" --resource-pattern-type LITERAL >/dev/null
# ledger: its group `P ledger` and `P ledger-recovery-*`
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Read --group "${P}ledger" --resource-pattern-type PREFIXED >/dev/null
# ledger: head-registry follower
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Read --group "${P}registry-" --resource-pattern-type PREFIXED >/dev/null
# ledger: log-end probe (`infra/log_position.py`)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:ledger --operation Read --group "${P}log-probe" --resource-pattern-type LITERAL >/dev/null
# serving: the heads it serves
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:serving --operation Read --topic "${P}heads." --resource-pattern-type PREFIXED >/dev/null
# serving: contracts (quantization, classes)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:serving --operation Read --topic "${P}head-registry" --resource-pattern-type LITERAL >/dev/null
# serving: heads follower
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:serving --operation Read --group "${P}serving-" --resource-pattern-type PREFIXED >/dev/null
# serving: head-registry follower
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:serving --operation Read --group "${P}registry-" --resource-pattern-type PREFIXED >/dev/null
# verifier: the deltas it replays
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:verifier --operation Read --topic "${P}deltas" --resource-pattern-type LITERAL >/dev/null
# verifier: the published head it certifies
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:verifier --operation Read --topic "${P}heads." --resource-pattern-type PREFIXED >/dev/null
# verifier: receipts it checks
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:verifier --operation Read --topic "${P}receipts" --resource-pattern-type LITERAL >/dev/null
# verifier: the subject-keys family
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:verifier --operation Read --topic "${P}subject-keys." --resource-pattern-type PREFIXED >/dev/null
# verifier: `unlearn erasure-report`: no plaintext record of the subject
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:verifier --operation Read --topic "${P}featurizer-cache" --resource-pattern-type LITERAL >/dev/null
# verifier: `unlearn erasure-report`: which transit keys still exist
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:verifier --operation Read --topic "${P}transit-private." --resource-pattern-type PREFIXED >/dev/null
# verifier: `unlearn erasure-report`: no readable original of the subject
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:verifier --operation Read --topic "${P}deadletter" --resource-pattern-type LITERAL >/dev/null
# verifier: `unlearn erasure-report`: no readable raw input of the subject
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:verifier --operation Read --topic "${P}requests" --resource-pattern-type LITERAL >/dev/null
# verifier: `unlearn erasure-report`: no readable raw input of the subject
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:verifier --operation Read --topic "${P}requests.by-head" --resource-pattern-type LITERAL >/dev/null
# verifier: its readers
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:verifier --operation Read --group "${P}verifier-" --resource-pattern-type PREFIXED >/dev/null
# client: add, delete, delete_subject
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:client --operation Write --topic "${P}requests" --resource-pattern-type LITERAL >/dev/null
# client: the SDK's receipt listener (`--wait`)
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:client --operation Read --topic "${P}receipts" --resource-pattern-type LITERAL >/dev/null
# client: the SDK seals adds under the published transit keys
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:client --operation Read --topic "${P}transit-keys" --resource-pattern-type LITERAL >/dev/null
# client: the SDK routes a head to its transit key's partition
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:client --operation Describe --topic "${P}requests.by-head" --resource-pattern-type LITERAL >/dev/null
# client: `unlearn head`
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:client --operation Read --topic "${P}heads." --resource-pattern-type PREFIXED >/dev/null
# client: `unlearn head` tells 'no such deployment' from 'no head yet'
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:client --operation Describe --topic "${P}deltas" --resource-pattern-type LITERAL >/dev/null
# client: receipt listener
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:client --operation Read --group "${P}client-receipts-" --resource-pattern-type PREFIXED >/dev/null
# client: `unlearn head`
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:client --operation Read --group "${P}head-reader-" --resource-pattern-type PREFIXED >/dev/null
# client: `unlearn head --follow`
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:client --operation Read --group "${P}head-follower-" --resource-pattern-type PREFIXED >/dev/null
# client: the SDK's transit key reader
kafka-acls.sh --bootstrap-server "${BOOTSTRAP}" --command-config "${ADMIN_CONFIG}" --add --allow-principal User:client --operation Read --group "${P}client-transit-" --resource-pattern-type PREFIXED >/dev/null
echo "acls: 60 rules for prefix $P"
