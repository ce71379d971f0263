#!/usr/bin/env bash
# Throw-away Apache Kafka broker for tests and local runs (docs/dev.md, "Kafka").
#
#   scripts/dev-kafka.sh install        fetch Kafka's jars from Maven Central (via ~/.m2) if missing
#   scripts/dev-kafka.sh start          format storage if needed and start the broker (no-op if
#                                       running); waits until it serves, prints the bootstrap URL
#   scripts/dev-kafka.sh stop           stop the broker cleanly and wait for it (no-op if stopped)
#   scripts/dev-kafka.sh restart        stop, then start
#   scripts/dev-kafka.sh status         exit 0 when running
#   scripts/dev-kafka.sh url            print the bootstrap servers, 127.0.0.1:PORT (SVC_KAFKA_URL)
#   scripts/dev-kafka.sh create-topics  create the service's topics if missing (starts the broker;
#                                       with SVC_KAFKA_URL set, on that cluster instead)
#
# One node in KRaft mode (broker and controller in one JVM, no ZooKeeper), run with the machine's
# Java 17+ from the jars of org.apache.kafka:kafka_2.13 (scripts/kafka/pom.xml). Plaintext, on
# 127.0.0.1 only; topics are not auto-created (create-topics makes the service's).
#
# Settings (environment):
#   SVC_KAFKA_DIR              jars, data and logs     (default $HOME/.cache/svc-kafka)
#   SVC_KAFKA_PORT             client port             (default 29092)
#   SVC_KAFKA_CONTROLLER_PORT  KRaft controller port   (default client port + 1)
#   SVC_KAFKA_VERSION          Kafka release           (default 4.3.1)
#   SVC_KAFKA_HEAP             JVM -Xmx                (default 512m)
#   SVC_KAFKA_START_TIMEOUT    seconds start waits     (default 120)
#   SVC_KAFKA_JAVA_OPTS        extra JVM options, after the script's (-XX:TieredStopAtLevel=4 ...)
# Layout under SVC_KAFKA_DIR: <version>/libs (jars), <version>/classes-*.jsa (JVM class-data
# archive), data/ (log.dirs: KRaft metadata and topic data), logs/server.log (broker log),
# logs/ready.log (the latest run's start-up lines), logs/kafka.out (JVM stdout/stderr),
# server.properties (written on each start), kafka.pid.
# Runs as the invoking user, root included (Kafka does not refuse root).
# The default ports sit below Linux's ephemeral range (32768-60999): a port inside it can be held
# as the local end of any client connection on the machine, which makes the broker's bind fail, and
# a client retrying a stopped broker's port can end up connected to itself.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSION="${SVC_KAFKA_VERSION:-4.3.1}"
PORT="${SVC_KAFKA_PORT:-29092}"
CONTROLLER_PORT="${SVC_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
DIR="${SVC_KAFKA_DIR:-${HOME:-/tmp}/.cache/svc-kafka}"
HEAP="${SVC_KAFKA_HEAP:-512m}"
START_TIMEOUT="${SVC_KAFKA_START_TIMEOUT:-120}"
TOPICS=(svc.decisions.v1 svc.events.v1)
PARTITIONS=3

LIBS="$DIR/$VERSION/libs"
TOOL="$DIR/$VERSION/tool"
PIDFILE="$DIR/kafka.pid"
PROPS="$DIR/server.properties"
LOGDIR="$DIR/logs"
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
JAVAC="${JAVA_HOME:+$JAVA_HOME/bin/}javac"

die() { echo "dev-kafka: $*" >&2; exit 1; }
note() { echo "dev-kafka: $*" >&2; }
is_root() { [[ "$(id -u)" == 0 ]]; }

# Serialise install/start/stop/create-topics on one directory (parallel test runs, CI retries).
lock() {
    mkdir -p "$DIR"
    exec 9>"$DIR/.lock"
    flock 9
}

log_tail() {
    local f
    for f in "$LOGDIR/kafka.out" "$LOGDIR/server.log" "$@"; do
        [[ -s "$f" ]] || continue
        echo "--- tail of $f" >&2
        tail -n 25 "$f" >&2
    done
}

java_major() {
    "$JAVA" -version 2>&1 | sed -n '1s/.*version "\([0-9]*\)[."].*/\1/p'
}

need_tools() {
    local missing=()
    command -v "$JAVA" >/dev/null || missing+=(java)
    command -v "$JAVAC" >/dev/null || missing+=(javac)
    command -v mvn >/dev/null || missing+=(mvn)
    if ((${#missing[@]})); then
        is_root && command -v apt-get >/dev/null \
            || die "missing ${missing[*]}: install a JDK 17+ and Maven (apt-get install openjdk-17-jdk-headless maven)"
        note "installing a JDK and Maven from Debian packages (missing: ${missing[*]})"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jdk-headless maven >&2
    fi
    local major
    major="$(java_major)"
    [[ -n "$major" && "$major" -ge 17 ]] || die "Kafka $VERSION brokers need Java 17+, $JAVA is ${major:-unknown}"
}

stamp() { cat "$HERE/kafka/pom.xml" "$HERE/kafka/SvcKafkaTool.java" | sha256sum | cut -c1-16; }

cmd_install() {
    local want
    want="$VERSION $(stamp)"
    if [[ -f "$DIR/$VERSION/.installed" && "$(cat "$DIR/$VERSION/.installed")" == "$want" ]]; then
        return 0
    fi
    need_tools
    mkdir -p "$DIR/$VERSION"
    local tmp="$DIR/$VERSION/.libs.tmp" out="$DIR/$VERSION/install.log"
    rm -rf "$tmp" "$TOOL.tmp"
    note "fetching Apache Kafka $VERSION jars from Maven Central (via ~/.m2) into $LIBS"
    if ! mvn -B -q -Dstyle.color=never -f "$HERE/kafka/pom.xml" -Dkafka.version="$VERSION" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" 2>&1 \
        | sed 's/\x1b\[[0-9;]*m//g' >"$out"; then
        tail -n 25 "$out" >&2
        die "Maven could not fetch Kafka $VERSION (log: $out)"
    fi
    [[ -f "$tmp/kafka_2.13-$VERSION.jar" ]] || die "kafka_2.13-$VERSION.jar missing after Maven (log: $out)"
    mkdir -p "$TOOL.tmp"
    "$JAVAC" -nowarn -d "$TOOL.tmp" -cp "$tmp/*" "$HERE/kafka/SvcKafkaTool.java" >>"$out" 2>&1 \
        || { tail -n 25 "$out" >&2; die "compiling scripts/kafka/SvcKafkaTool.java failed (log: $out)"; }
    rm -rf "$LIBS" "$TOOL"
    mv "$tmp" "$LIBS"
    mv "$TOOL.tmp" "$TOOL"
    echo "$want" >"$DIR/$VERSION/.installed"
}

# Exit 0 when process $1 exists and is not a zombie (a container's PID 1 may not reap).
alive() {
    local state
    state="$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null)"
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# PID of our broker (from the pid file, checked against its command line) when it is alive.
broker_pid() {
    [[ -f "$PIDFILE" ]] || return 1
    local pid
    pid="$(cat "$PIDFILE")"
    [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $PROPS" || return 1
    echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

cmd_url() { echo "127.0.0.1:$PORT"; }

write_props() {
    cat >"$PROPS" <<EOF
# Written by scripts/dev-kafka.sh on each start; edit the script, not this file.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DIR/data
# One node: every replicated internal topic has one replica.
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=5
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Like a locked-down production cluster: topics come from create-topics (or a test's Admin call).
auto.create.topics.enable=false
num.partitions=$PARTITIONS
# A small machine: few threads.
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=4
log.retention.hours=72
EOF
}

cmd_start() {
    cmd_install
    lock
    local pid
    if pid="$(broker_pid)"; then
        cmd_url
        return 0
    fi
    rm -f "$PIDFILE"
    local p
    for p in "$PORT" "$CONTROLLER_PORT"; do
        if port_open "$p"; then
            die "port $p on 127.0.0.1 is in use by another process (set SVC_KAFKA_PORT / SVC_KAFKA_CONTROLLER_PORT)"
        fi
    done
    mkdir -p "$DIR/data" "$LOGDIR"
    write_props
    if [[ ! -f "$DIR/data/meta.properties" ]]; then
        # A cluster id is 16 random bytes in URL-safe base64 without padding (Kafka's Uuid).
        # One starting with `-` would be read by the storage tool as an option: draw again.
        local cluster_id="-"
        while [[ $cluster_id == -* ]]; do
            cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
        done
        note "formatting KRaft storage in $DIR/data (cluster id $cluster_id)"
        "$JAVA" -Xmx256m -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
            -Dkafka.logs.dir="$LOGDIR" -cp "$LIBS/*" kafka.tools.StorageTool format \
            -t "$cluster_id" -c "$PROPS" >"$LOGDIR/format.log" 2>&1 \
            || { log_tail "$LOGDIR/format.log"; die "formatting storage failed (log: $LOGDIR/format.log)"; }
    fi
    # Readiness comes from ready.log (scripts/kafka/log4j2.properties), which this run's broker
    # writes afresh; server.log may roll over during start-up.
    local ready="$LOGDIR/ready.log"
    rm -f "$ready"
    echo "=== $(date -Is) starting Kafka $VERSION on 127.0.0.1:$PORT" >>"$LOGDIR/kafka.out"
    # Start-up on a busy 2-core machine: C1 only (a dev broker needs no peak JIT) and a class-data
    # archive of the broker's classes, written when the first run exits and mapped by later runs
    # (roughly halves the time to ready; the JVM ignores an archive that does not match it).
    local jsa cds
    jsa="$DIR/$VERSION/classes-$(stat -Lc '%s-%Y' "$(command -v "$JAVA")").jsa"
    if [[ -s "$jsa" ]]; then cds="-XX:SharedArchiveFile=$jsa"; else cds="-XX:ArchiveClassesAtExit=$jsa"; fi
    # setsid: its own session, so a Ctrl-C in the terminal that ran the tests does not reach it.
    # shellcheck disable=SC2086 # SVC_KAFKA_JAVA_OPTS is a list of options
    setsid "$JAVA" -Xms128m -Xmx"$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
        -XX:+ExitOnOutOfMemoryError -XX:TieredStopAtLevel=1 "$cds" -Xlog:cds=off,cds+dynamic=off \
        -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" -Dkafka.logs.dir="$LOGDIR" \
        ${SVC_KAFKA_JAVA_OPTS:-} \
        -cp "$LIBS/*" kafka.Kafka "$PROPS" </dev/null >>"$LOGDIR/kafka.out" 2>&1 9>&- &
    pid=$!
    echo "$pid" >"$PIDFILE"
    local deadline=$((SECONDS + START_TIMEOUT))
    while :; do
        if ! alive "$pid"; then
            log_tail
            die "broker exited during start-up (logs: $LOGDIR)"
        fi
        # Ready: the broker logged that it started and accepts connections.
        if [[ -f "$ready" ]] && grep -q "Kafka Server started" "$ready" && port_open "$PORT"; then
            break
        fi
        if ((SECONDS >= deadline)); then
            log_tail
            cmd_stop_locked
            die "broker not ready after ${START_TIMEOUT}s (logs: $LOGDIR)"
        fi
        sleep 0.2
    done
    note "Kafka $VERSION ready on 127.0.0.1:$PORT (pid $pid, data $DIR/data, log $LOGDIR/server.log)"
    cmd_url
}

cmd_stop_locked() {
    local pid
    if ! pid="$(broker_pid)"; then
        rm -f "$PIDFILE"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 60))
    while broker_pid >/dev/null; do
        if ((SECONDS >= deadline)); then
            note "broker (pid $pid) still running 60s after SIGTERM; killing it"
            log_tail
            kill -KILL "$pid" 2>/dev/null || true
            sleep 1
            break
        fi
        sleep 0.2
    done
    rm -f "$PIDFILE"
    # The kernel may hold the ports a moment longer; start checks them, so wait here.
    deadline=$((SECONDS + 10))
    while { port_open "$PORT" || port_open "$CONTROLLER_PORT"; } && ((SECONDS < deadline)); do sleep 0.2; done
}

cmd_stop() {
    [[ -d "$DIR" ]] || return 0
    lock
    cmd_stop_locked
}

cmd_status() {
    local pid
    if pid="$(broker_pid)"; then
        note "running: pid $pid, 127.0.0.1:$PORT, data $DIR/data"
        return 0
    fi
    note "not running"
    return 1
}

cmd_create_topics() {
    local bootstrap="${SVC_KAFKA_URL:-}"
    if [[ -n "$bootstrap" ]]; then
        cmd_install
    else
        bootstrap="$(cmd_start)"
    fi
    # No log4j configuration: Log4j's default logs errors only, to the console.
    "$JAVA" -Xmx128m -XX:TieredStopAtLevel=1 -cp "$TOOL:$LIBS/*" SvcKafkaTool create-topics \
        "$bootstrap" "$PARTITIONS" "${TOPICS[@]}" \
        || die "creating topics on $bootstrap failed"
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    restart) cmd_stop && cmd_start ;;
    status) cmd_status ;;
    url) cmd_url ;;
    create-topics) cmd_create_topics ;;
    *) echo "usage: $0 {install|start|stop|restart|status|url|create-topics}" >&2; exit 2 ;;
esac
