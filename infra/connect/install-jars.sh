#!/bin/sh
# `make connect`: resolve the pinned Kafka Connect runtime and Debezium PostgreSQL connector jars
# (infra/connect/pom.xml) from Maven Central into .cache/connect/<kafka>-<debezium>/lib and check
# every jar against infra/connect/jars.sha256: a changed, missing or extra jar fails, and nothing is
# left in lib/ (infra/jars.sh, shared with `make kafka`). Then stamps lib/../.verified.
#   --relock   write jars.sha256 from what Maven resolved instead of checking (a deliberate
#              version change; review the diff).
# Needs java (17+) and mvn on PATH.
set -eu
cd "$(dirname "$0")/../.."
here=infra/connect
lock=$here/jars.sha256
kafka=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' $here/pom.xml)
debezium=$(sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' $here/pom.xml)
broker=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' infra/kafka/pom.xml)
[ -n "$kafka" ] && [ -n "$debezium" ] || { echo "make connect: no <kafka.version>/<debezium.version> in $here/pom.xml" >&2; exit 1; }
[ "$kafka" = "$broker" ] || { echo "make connect: Connect $kafka differs from the broker's Kafka $broker (infra/kafka/pom.xml)" >&2; exit 1; }
cache=.cache/connect/$kafka-$debezium
tmp=$cache/lib.tmp
. infra/jars.sh
resolve_jars connect $here/pom.xml "$lock" "$cache" "${1:-}"
# The one class Debezium 3.6.1 needs that Kafka 4.x moved (compat/..../Sanitizer.java says why),
# compiled against the verified kafka-clients jar into its own jar, outside the sha256 list.
command -v javac >/dev/null || { echo "make connect: javac not found: install a JDK 17+ (Debian: apt-get install openjdk-17-jdk-headless)" >&2; rm -rf "$tmp"; exit 1; }
classes=$cache/compat.classes
rm -rf "$classes" && mkdir -p "$classes"
javac --release 17 -nowarn -cp "$tmp/kafka-clients-$kafka.jar" -d "$classes" \
    $here/compat/org/apache/kafka/common/utils/Sanitizer.java
(cd "$classes" && jar cf "$OLDPWD/$tmp/zz-unlearn-kafka-compat.jar" org)
rm -rf "$classes"
rm -rf "$cache/lib"
mv "$tmp" "$cache/lib"
echo "$kafka-$debezium" > "$cache/.verified"
echo "make connect: Kafka Connect $kafka + Debezium $debezium: $(grep -vc "^#" "$lock") jars verified and the compat jar built in $cache/lib"
