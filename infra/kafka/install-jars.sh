#!/bin/sh
# `make kafka`: resolve the pinned Apache Kafka broker jars (infra/kafka/pom.xml) from Maven Central
# into .cache/kafka/<version>/lib and check every jar against infra/kafka/jars.sha256: a changed,
# missing or extra jar fails, and nothing is left in lib/. Then stamps lib/../.verified.
#   --relock   write jars.sha256 from what Maven resolved instead of checking (a deliberate
#              version change; review the diff).
# Needs java (17+) and mvn on PATH. Resolution into an empty ~/.m2 takes ~6 s and ~66 MB there, 43 MB in lib.
set -eu
cd "$(dirname "$0")/../.."
here=infra/kafka
lock=$here/jars.sha256
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' $here/pom.xml)
[ -n "$version" ] || { echo "make kafka: no <kafka.version> in $here/pom.xml" >&2; exit 1; }
cache=.cache/kafka/$version
tmp=$cache/lib.tmp
. infra/jars.sh
resolve_jars kafka $here/pom.xml "$lock" "$cache" "${1:-}"
rm -rf "$cache/lib"
mv "$tmp" "$cache/lib"
echo "$version" > "$cache/.verified"
echo "make kafka: Apache Kafka $version: $(ls "$cache/lib" | wc -l) jars verified in $cache/lib"
