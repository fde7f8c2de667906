# Sourced by infra/kafka/install-jars.sh and infra/connect/install-jars.sh (POSIX sh, run from the
# checkout's root): resolve the runtime jars of a pom from Maven Central and check every one
# against a sha256 list; a changed, missing or extra jar fails and leaves nothing behind.
#   resolve_jars WHAT POM LOCK CACHE [--relock]
# resolves into CACHE/lib.tmp (the caller moves it into place); --relock writes LOCK instead of
# checking (a deliberate version change; review the diff).
resolve_jars() {
    what=$1 pom=$2 lock=$3 cache=$4 mode=${5:-}
    command -v mvn >/dev/null || { echo "make $what: mvn not found: install Maven (Debian: apt-get install maven)" >&2; return 1; }
    command -v java >/dev/null || { echo "make $what: java not found: install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)" >&2; return 1; }
    tmp=$cache/lib.tmp
    rm -rf "$tmp" "$cache/.verified"
    mkdir -p "$tmp"
    mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$PWD/$tmp"
    actual=$(cd "$tmp" && sha256sum -- *.jar | LC_ALL=C sort -k2)
    if [ "$mode" = "--relock" ]; then
        { sed -n '/^#/p' "$lock"; echo "$actual"; } > "$lock.new" && mv "$lock.new" "$lock"
        echo "make $what: wrote $lock ($(echo "$actual" | wc -l) jars); review the diff"
        return 0
    fi
    expected=$(grep -v '^#' "$lock" | LC_ALL=C sort -k2)
    if [ "$actual" != "$expected" ]; then
        echo "make $what: the resolved jars do not match $lock (changed, missing or extra jar):" >&2
        printf '%s\n' "$expected" > "$tmp.expected"
        printf '%s\n' "$actual" | diff "$tmp.expected" - >&2 || true
        rm -rf "$tmp" "$tmp.expected" "$cache/lib"
        return 1
    fi
}
