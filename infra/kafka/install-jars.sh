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
command -v mvn >/dev/null || { echo "make kafka: mvn not found: install Maven (Debian: apt-get install maven)" >&2; exit 1; }
command -v java >/dev/null || { echo "make kafka: java not found: install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
cache=.cache/kafka/$version
tmp=$cache/lib.tmp
rm -rf "$tmp" "$cache/.verified"
mkdir -p "$tmp"
mvn -q -B -Dstyle.color=never -f $here/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$PWD/$tmp"
actual=$(cd "$tmp" && sha256sum -- *.jar | LC_ALL=C sort -k2)
if [ "${1:-}" = "--relock" ]; then
    { sed -n '/^#/p' "$lock"; echo "$actual"; } > "$lock.new" && mv "$lock.new" "$lock"
    echo "make kafka: wrote $lock ($(echo "$actual" | wc -l) jars); review the diff"
else
    expected=$(grep -v '^#' "$lock" | LC_ALL=C sort -k2)
    if [ "$actual" != "$expected" ]; then
        echo "make kafka: the resolved jars do not match $lock (changed, missing or extra jar):" >&2
        printf '%s\n' "$expected" > "$tmp.expected"
        printf '%s\n' "$actual" | diff "$tmp.expected" - >&2 || true
        rm -rf "$tmp" "$tmp.expected" "$cache/lib"
        exit 1
    fi
fi
rm -rf "$cache/lib"
mv "$tmp" "$cache/lib"
echo "$version" > "$cache/.verified"
echo "make kafka: Apache Kafka $version: $(ls "$cache/lib" | wc -l) jars verified in $cache/lib"
