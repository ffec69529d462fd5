#!/usr/bin/env bash
# A throwaway single-node Apache Kafka broker for integration tests: KRaft mode, one JVM that is
# both broker and controller, listening on two free loopback ports, with its config, logs and
# data in one folder. The jars come from Maven Central through tests/kafka/pom.xml.
#
#   kafka-broker.sh fetch
#       Downloads the jars into $SPILLWAY_KAFKA_HOME/lib (lib-<version> for
#       SPILLWAY_KAFKA_VERSION) once; fast when already there. Prints KAFKA_LIB=<folder>.
#   kafka-broker.sh start DIR
#       A new broker whose files live in DIR (created; must not hold a broker already). Fetches
#       the jars when needed, formats storage, starts the JVM in the background and returns when
#       the broker answers metadata requests. Prints BOOTSTRAP=127.0.0.1:<port> and PID=<pid>
#       (and writes them, with the ports and STARTUP_MS, to DIR/env).
#   kafka-broker.sh stop DIR
#       SIGTERM (SIGKILL after $SPILLWAY_KAFKA_STOP_TIMEOUT s), then removes DIR. No-op when DIR
#       does not exist.
#   kafka-broker.sh kill DIR
#       SIGKILL (a crash); DIR and its data stay.
#   kafka-broker.sh restart DIR
#       Starts the broker of DIR again on the same ports and data (stopping it first with
#       SIGTERM when it still runs). Prints BOOTSTRAP= and PID= like start.
#   kafka-broker.sh topic DIR NAME PARTITIONS [TopicCommand options, e.g. --config k=v]
#       Creates topic NAME (replication factor 1; no error when it already exists) and returns
#       once every partition has a leader.
#
# Environment:
#   SPILLWAY_KAFKA_HOME           jar cache (default $HOME/.cache/spillway-kafka)
#   SPILLWAY_KAFKA_VERSION        Kafka version instead of the POM's kafka.version (4.4.0)
#   SPILLWAY_KAFKA_HEAP           broker heap options (default "-Xms512m -Xmx1g")
#   SPILLWAY_KAFKA_JVM_OPTS       broker GC/JIT options, replacing the default
#                                 "-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1"
#                                 (C1 only, quicker start; set "" for the JVM's own defaults)
#   SPILLWAY_KAFKA_PROPS          extra server.properties lines (later keys win)
#   SPILLWAY_KAFKA_HOST           numeric IPv4 address the PLAINTEXT listener binds and
#                                 advertises, so that clients in other network namespaces
#                                 reach it (scripts/fleet-bed.sh: a bridge's address); default
#                                 127.0.0.1. BOOTSTRAP names it. The controller and the SASL/TLS
#                                 listeners stay on 127.0.0.1.
#   SPILLWAY_KAFKA_READY_TIMEOUT  seconds start/restart wait for readiness (default 60)
#   SPILLWAY_KAFKA_STOP_TIMEOUT   seconds stop waits after SIGTERM (default 30)
#   SPILLWAY_SVC_OWNER            a PID (usually the test script's $$): when it exits, a
#                                 watchdog stops the broker and removes DIR. Unset/0: none.
#   SPILLWAY_KAFKA_SASL           plain | scram: start also adds a SASL_PLAINTEXT listener on a
#                                 third port accepting PLAIN and SCRAM-SHA-256 for one user, and
#                                 prints SASL_BOOTSTRAP=127.0.0.1:<port> and
#                                 KAFKA_CLIENT_PROPS='security.protocol=SASL_PLAINTEXT
#                                 sasl.mechanism=PLAIN|SCRAM-SHA-256 sasl.username=U
#                                 sasl.password=P' (librdkafka properties, one -X each). The
#                                 PLAINTEXT listener (BOOTSTRAP) stays for the broker's own
#                                 traffic and for `topic`.
#   SPILLWAY_KAFKA_SASL_USER      that user (default spillway)
#   SPILLWAY_KAFKA_SASL_PASSWORD  its password (default: random, see KAFKA_CLIENT_PROPS)
#   SPILLWAY_KAFKA_TLS            1 (with SPILLWAY_KAFKA_SASL): also a SASL_SSL listener, with a
#                                 throwaway CA and a certificate for 127.0.0.1 made with openssl
#                                 in DIR/tls; prints SSL_BOOTSTRAP=127.0.0.1:<port> and
#                                 KAFKA_SSL_CLIENT_PROPS (as above, security.protocol=SASL_SSL and
#                                 ssl.ca.location=DIR/tls/ca.pem). Needs openssl.
#   The printed values are quoted for eval (printf %q); they are also in DIR/env (mode 0600).
# Needs java (17+), mvn (fetch only) and kcat.
set -euo pipefail
SVC_NAME=kafka-broker
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/svc-lib.sh
. "$HERE/svc-lib.sh"
POM=$HERE/../tests/kafka/pom.xml
JAVA=${JAVA:-java}
[ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ] && [ "$JAVA" = java ] && JAVA=$JAVA_HOME/bin/java
MARKER=.spillway-kafka-broker
# Short-lived tools (storage format, topic creation): small heap, no C2, quick to start.
TOOL_OPTS=(-Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true)

kafka_home() { svc_abs "${SPILLWAY_KAFKA_HOME:-$HOME/.cache/spillway-kafka}"; }

# ensure_lib: sets LIB to a folder holding every jar, fetching them first when needed.
ensure_lib() {
  local home want t0 n
  home=$(kafka_home)
  LIB=$home/lib${SPILLWAY_KAFKA_VERSION:+-$SPILLWAY_KAFKA_VERSION}
  want=$({ cat "$POM"; echo "kafka.version=${SPILLWAY_KAFKA_VERSION:-}"; } | sha256sum | cut -c1-64)
  [ "$(cat "$LIB/.stamp" 2>/dev/null)" = "$want" ] && return 0
  command -v mvn >/dev/null || svc_die "mvn not found (scripts/install-deps.sh installs maven)"
  mkdir -p "$home"
  exec 9>"$home/.lock"
  flock -w 900 9 || svc_die "timed out waiting for another fetch into $home"
  if [ "$(cat "$LIB/.stamp" 2>/dev/null)" != "$want" ]; then
    t0=$(svc_now_ms)
    rm -rf "$LIB.tmp"
    local args=(-q -B -f "$POM" dependency:copy-dependencies -DincludeScope=runtime
                "-DoutputDirectory=$LIB.tmp")
    [ -n "${SPILLWAY_KAFKA_VERSION:-}" ] && args+=("-Dkafka.version=$SPILLWAY_KAFKA_VERSION")
    if ! mvn "${args[@]}" >"$home/fetch.log" 2>&1; then
      tail -n 40 "$home/fetch.log" >&2
      svc_die "mvn could not fetch the Kafka jars (log: $home/fetch.log)"
    fi
    compgen -G "$LIB.tmp/kafka_2.13-*.jar" >/dev/null ||
      svc_die "mvn fetched no kafka_2.13 jar into $LIB.tmp"
    echo "$want" >"$LIB.tmp/.stamp"
    rm -rf "$LIB"
    mv "$LIB.tmp" "$LIB"
    n=$(find "$LIB" -name '*.jar' | wc -l)
    svc_log "fetched $n jars into $LIB in $(svc_since "$t0") s"
  fi
  exec 9>&-
}

# write_config DIR PORT CPORT: server.properties and the two log4j2 configurations.
write_config() {
  local dir=$1 port=$2 cport=$3
  cat >"$dir/server.properties" <<EOF
# Written by scripts/kafka-broker.sh. One node, both broker and controller (KRaft).
# A .properties value cannot carry a trailing comment: comments stay on their own lines.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$cport
listeners=PLAINTEXT://$HOST:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://$HOST:$port,CONTROLLER://127.0.0.1:$cport
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
# Topics are created explicitly (kafka-broker.sh topic), never by a client's request.
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
# Internal topics of a single node: replication 1, few partitions (created on first use).
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
# The first consumer of a group gets its assignment at once.
group.initial.rebalance.delay.ms=0
# After a SIGKILL the restarted node cannot register until its previous registration expires
# (default 9 s); short heartbeats keep a restart quick.
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
# A 2-core machine: fewer threads than the defaults.
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
background.threads=4
EOF
  if [ -n "$SASL_PORT" ]; then write_sasl_config "$dir" "$port" "$cport"; fi
  if [ -n "${SPILLWAY_KAFKA_PROPS:-}" ]; then
    printf '# From SPILLWAY_KAFKA_PROPS\n%s\n' "$SPILLWAY_KAFKA_PROPS" >>"$dir/server.properties"
  fi
  cat >"$dir/log4j2.properties" <<EOF
# The broker logs to $dir/server.log.
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $dir/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
# The full configuration dump (hundreds of lines, several times per start) is left out.
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
EOF
  cat >"$dir/tools-log4j2.properties" <<'EOF'
# Command-line tools (storage format, topic creation): warnings and errors on stderr.
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
EOF
}

# The PLAINTEXT listener's address (SPILLWAY_KAFKA_HOST): set here for start, read back from
# DIR/env by restart.
HOST=${SPILLWAY_KAFKA_HOST:-127.0.0.1}
[[ $HOST =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || svc_die "SPILLWAY_KAFKA_HOST must be a numeric IPv4 address"

# SASL (SPILLWAY_KAFKA_SASL) and TLS (SPILLWAY_KAFKA_TLS): set by sasl_init in start, read back
# from DIR/env by restart. Empty when off.
SASL_PORT=
SSL_PORT=
SASL_USER=
SASL_PASSWORD=
SASL_MECH=

# sasl_init PORT CPORT: checks the settings and picks the extra ports (start only).
sasl_init() {
  case ${SPILLWAY_KAFKA_SASL:-} in
    '') [ -n "${SPILLWAY_KAFKA_TLS:-}" ] && svc_die "SPILLWAY_KAFKA_TLS needs SPILLWAY_KAFKA_SASL"
        return 0 ;;
    plain) SASL_MECH=PLAIN ;;
    scram) SASL_MECH=SCRAM-SHA-256 ;;
    *) svc_die "SPILLWAY_KAFKA_SASL must be plain or scram" ;;
  esac
  SASL_USER=${SPILLWAY_KAFKA_SASL_USER:-spillway}
  [ -n "$SASL_PASSWORD" ] ||
    SASL_PASSWORD=${SPILLWAY_KAFKA_SASL_PASSWORD:-$(head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')}
  case $SASL_USER$SASL_PASSWORD in
    *[!A-Za-z0-9._-]*) svc_die "SASL user and password: letters, digits, '.', '_', '-' only" ;;
  esac
  SASL_PORT=$(svc_pick_port "$1" "$2")
  if [ "${SPILLWAY_KAFKA_TLS:-}" = 1 ]; then
    command -v openssl >/dev/null || svc_die "openssl not found (needed by SPILLWAY_KAFKA_TLS)"
    SSL_PORT=$(svc_pick_port "$1" "$2" "$SASL_PORT")
  fi
}

# make_tls DIR: a throwaway CA and a broker certificate for 127.0.0.1 signed by it, in DIR/tls:
# ca.pem (the clients' ssl.ca.location) and broker.p12 (the broker's keystore, PKCS12, with the
# SASL password as its password).
make_tls() {
  local t=$1/tls
  rm -rf "$t"
  mkdir -p "$t"
  (
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=spillway test CA" \
      -keyout "$t/ca.key" -out "$t/ca.pem"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
      -keyout "$t/broker.key" -out "$t/broker.csr"
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n' >"$t/ext.cnf"
    openssl x509 -req -in "$t/broker.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" -CAcreateserial \
      -days 2 -extfile "$t/ext.cnf" -out "$t/broker.pem"
    openssl pkcs12 -export -in "$t/broker.pem" -inkey "$t/broker.key" -certfile "$t/ca.pem" \
      -name broker -passout "pass:$SASL_PASSWORD" -out "$t/broker.p12"
  ) >"$t/openssl.log" 2>&1 || { cat "$t/openssl.log" >&2; svc_die "making the TLS files in $t failed"; }
  chmod 644 "$t/ca.pem"
}

# write_sasl_config DIR PORT CPORT: the SASL (and SASL_SSL) listeners, overriding the listener
# lines written above (later keys win). server.properties then holds passwords: made 0600.
write_sasl_config() {
  local dir=$1 port=$2 cport=$3 l map jaas_plain as
  local -a names=(sasl_plaintext)
  l="PLAINTEXT://$HOST:$port,CONTROLLER://127.0.0.1:$cport,SASL_PLAINTEXT://127.0.0.1:$SASL_PORT"
  map="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
  if [ -n "$SSL_PORT" ]; then
    make_tls "$dir"
    l="$l,SASL_SSL://127.0.0.1:$SSL_PORT"
    map="$map,SASL_SSL:SASL_SSL"
    names+=(sasl_ssl)
  fi
  chmod 600 "$dir/server.properties"
  jaas_plain="org.apache.kafka.common.security.plain.PlainLoginModule required user_$SASL_USER=\"$SASL_PASSWORD\";"
  {
    echo "# SPILLWAY_KAFKA_SASL: PLAIN and SCRAM-SHA-256 for one user"
    echo "listeners=$l"
    echo "advertised.listeners=$l"
    echo "listener.security.protocol.map=$map"
    echo "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256"
    for as in "${names[@]}"; do
      echo "listener.name.$as.plain.sasl.jaas.config=$jaas_plain"
      echo "listener.name.$as.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
    done
    if [ -n "$SSL_PORT" ]; then
      echo "listener.name.sasl_ssl.ssl.keystore.type=PKCS12"
      echo "listener.name.sasl_ssl.ssl.keystore.location=$dir/tls/broker.p12"
      echo "listener.name.sasl_ssl.ssl.keystore.password=$SASL_PASSWORD"
      echo "listener.name.sasl_ssl.ssl.key.password=$SASL_PASSWORD"
    fi
  } >>"$dir/server.properties"
}

# client_props PROTOCOL: the SASL user's librdkafka properties, space-separated.
client_props() {
  printf 'security.protocol=%s sasl.mechanism=%s sasl.username=%s sasl.password=%s' \
    "$1" "$SASL_MECH" "$SASL_USER" "$SASL_PASSWORD"
}

# run_tool DIR LOGFILE CLASS ARGS...: a Kafka command-line tool from the jars.
run_tool() {
  local dir=$1 log=$2 cls=$3
  shift 3
  "$JAVA" "${TOOL_OPTS[@]}" "-Dlog4j2.configurationFile=$dir/tools-log4j2.properties" \
    -cp "$LIB/*" "$cls" "$@" >"$log" 2>&1
}

# format_storage DIR: a new cluster id and a formatted, empty log dir with DIR's node as the
# only controller voter (--standalone: the quorum is dynamic, named by
# controller.quorum.bootstrap.servers).
format_storage() {
  local dir=$1 cid
  rm -rf "$dir/data"
  # A cluster id is 16 random bytes in URL-safe base64 without padding (what
  # "kafka.tools.StorageTool random-uuid" prints), made here to save a JVM start.
  cid=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
  # A leading '-' would be read as an option by the storage tool: draw again.
  while [ "${cid#-}" != "$cid" ]; do
    cid=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
  done
  # SCRAM credentials live in the cluster metadata: written at format time
  local -a scram=()
  [ -n "$SASL_PORT" ] && scram=(--add-scram "SCRAM-SHA-256=[name=$SASL_USER,password=$SASL_PASSWORD]")
  run_tool "$dir" "$dir/format.log" kafka.tools.StorageTool format --standalone \
    -t "$cid" -c "$dir/server.properties" "${scram[@]}" ||
    { cat "$dir/format.log" >&2; svc_die "formatting storage in $dir/data failed"; }
}

# launch DIR PORT: starts the JVM and waits for readiness. Sets PID, PID_START, STARTUP_MS.
# Returns 0 when ready, 1 when the JVM exited, 2 at the deadline (the JVM is then killed).
launch() {
  local dir=$1 port=$2 t0 deadline meta
  local heap=${SPILLWAY_KAFKA_HEAP:--Xms512m -Xmx1g}
  # C1 only: a third less CPU to start on a busy 2-core machine, fast enough for tests.
  local jvm=${SPILLWAY_KAFKA_JVM_OPTS--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1}
  local -a opts
  # shellcheck disable=SC2206
  opts=($heap $jvm -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true)
  t0=$(svc_now_ms)
  deadline=$(( t0 + ${SPILLWAY_KAFKA_READY_TIMEOUT:-60} * 1000 ))
  echo "=== start $(date -u +%FT%TZ)" >>"$dir/stdout.log"
  (exec "$JAVA" "${opts[@]}" "-Dlog4j2.configurationFile=$dir/log4j2.properties" \
        -cp "$LIB/*" kafka.Kafka "$dir/server.properties") </dev/null >>"$dir/stdout.log" 2>&1 &
  PID=$!
  disown "$PID" 2>/dev/null || true
  PID_START=$(svc_starttime "$PID") || return 1
  while :; do
    svc_alive "$PID" "$PID_START" || return 1
    # The broker's port opens only once the broker is ready (the controller's opens earlier).
    meta=$(timeout 10 kcat -b "$HOST:$port" -L -m 2 2>/dev/null || true)
    if grep -q '^ *broker 1 at' <<<"$meta"; then
      STARTUP_MS=$(( $(svc_now_ms) - t0 ))
      echo "$(date -u +%FT%TZ) ready in $STARTUP_MS ms" >>"$dir/startup.log"
      return 0
    fi
    if [ "$(svc_now_ms)" -ge "$deadline" ]; then
      kill -KILL "$PID" 2>/dev/null || true
      svc_wait_gone "$PID" "$PID_START" 10 || true
      return 2
    fi
    sleep 0.2
  done
}

# why_dead DIR: the end of the broker's logs, on stderr.
why_dead() {
  echo "--- $1/stdout.log (end)" >&2
  tail -n 20 "$1/stdout.log" >&2 || true
  echo "--- $1/server.log (errors)" >&2
  grep -E 'ERROR|FATAL|Exception' "$1/server.log" 2>/dev/null | tail -n 20 >&2 || true
}

bind_failed() { grep -qs 'Address already in use' "$1/stdout.log" "$1/server.log"; }

# publish DIR PORT CPORT: writes DIR/env and prints the caller's lines.
publish() {
  local dir=$1 port=$2 cport=$3
  cat >"$dir/env.tmp" <<EOF
BOOTSTRAP=$HOST:$port
KAFKA_HOST=$HOST
PID=$PID
PID_START=$PID_START
KAFKA_PORT=$port
CONTROLLER_PORT=$cport
STARTUP_MS=$STARTUP_MS
KAFKA_LIB=$LIB
EOF
  local extra=
  if [ -n "$SASL_PORT" ]; then
    extra="SASL_BOOTSTRAP=127.0.0.1:$SASL_PORT"$'\n'
    extra+="KAFKA_CLIENT_PROPS=$(printf %q "$(client_props SASL_PLAINTEXT)")"$'\n'
    if [ -n "$SSL_PORT" ]; then
      extra+="SSL_BOOTSTRAP=127.0.0.1:$SSL_PORT"$'\n'
      extra+="KAFKA_SSL_CLIENT_PROPS=$(printf %q "$(client_props SASL_SSL) ssl.ca.location=$dir/tls/ca.pem")"$'\n'
    fi
    chmod 600 "$dir/env.tmp"
    # restart reads these back
    printf 'SASL_PORT=%s\nSSL_PORT=%s\nSASL_USER=%s\nSASL_PASSWORD=%s\nSASL_MECH=%s\n%s' \
      "$SASL_PORT" "$SSL_PORT" "$SASL_USER" "$SASL_PASSWORD" "$SASL_MECH" "$extra" >>"$dir/env.tmp"
  fi
  mv "$dir/env.tmp" "$dir/env"
  svc_watchdog "${SPILLWAY_SVC_OWNER:-0}" "$PID" "$PID_START" "$dir"
  svc_log "ready at $HOST:$port (pid $PID) in $STARTUP_MS ms"
  echo "BOOTSTRAP=$HOST:$port"
  echo "PID=$PID"
  printf '%s' "$extra"
}

# load_sasl DIR: the SASL settings of DIR's broker (restart).
load_sasl() {
  SASL_PORT=$(svc_env_get "$1/env" SASL_PORT)
  SSL_PORT=$(svc_env_get "$1/env" SSL_PORT)
  SASL_USER=$(svc_env_get "$1/env" SASL_USER)
  SASL_PASSWORD=$(svc_env_get "$1/env" SASL_PASSWORD)
  SASL_MECH=$(svc_env_get "$1/env" SASL_MECH)
}

# use_lib_of DIR: sets LIB to the jars DIR's broker was started with (fetching when gone).
use_lib_of() {
  LIB=$(svc_env_get "$1/env" KAFKA_LIB)
  if [ -z "$LIB" ] || [ ! -f "$LIB/.stamp" ]; then ensure_lib; fi
}

# broker_dir DIR: DIR as an absolute path, checked to be one of ours.
broker_dir() { svc_dir "$1" "$MARKER" "kafka-broker.sh start"; }

cmd_start() {
  local dir port cport attempt rc
  dir=$(svc_abs "$1")
  [ -e "$dir/$MARKER" ] && svc_die "$dir already holds a broker: restart it, or stop it first"
  if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then svc_die "$dir is not empty"; fi
  command -v kcat >/dev/null || svc_die "kcat not found (scripts/install-deps.sh installs it)"
  command -v "$JAVA" >/dev/null || svc_die "java not found"
  ensure_lib
  mkdir -p "$dir"
  : >"$dir/$MARKER"
  for attempt in 1 2 3; do
    port=$(svc_pick_port)
    cport=$(svc_pick_port "$port")
    sasl_init "$port" "$cport"
    write_config "$dir" "$port" "$cport"
    format_storage "$dir"
    rc=0
    launch "$dir" "$port" || rc=$?
    if [ "$rc" = 0 ]; then
      publish "$dir" "$port" "$cport"
      return 0
    fi
    if [ "$rc" = 1 ] && bind_failed "$dir" && [ "$attempt" -lt 3 ]; then
      svc_log "port $port or $cport was taken meanwhile: trying others"
      mv "$dir/stdout.log" "$dir/stdout.log.$attempt"
      mv "$dir/server.log" "$dir/server.log.$attempt" 2>/dev/null || true
      continue
    fi
    why_dead "$dir"
    [ "$rc" = 2 ] && svc_die "not ready within ${SPILLWAY_KAFKA_READY_TIMEOUT:-60} s (killed; files in $dir)"
    svc_die "the broker exited during start-up (files in $dir)"
  done
}

cmd_restart() {
  local dir port cport pid start rc=0
  dir=$(broker_dir "$1")
  [ -f "$dir/env" ] || svc_die "$dir has no env file: its broker never started"
  port=$(svc_env_get "$dir/env" KAFKA_PORT)
  cport=$(svc_env_get "$dir/env" CONTROLLER_PORT)
  pid=$(svc_env_get "$dir/env" PID)
  start=$(svc_env_get "$dir/env" PID_START)
  load_sasl "$dir"
  HOST=$(svc_env_get "$dir/env" KAFKA_HOST)
  HOST=${HOST:-127.0.0.1}
  if svc_alive "$pid" "$start"; then
    svc_terminate "$pid" "$start" "${SPILLWAY_KAFKA_STOP_TIMEOUT:-30}" ||
      svc_die "pid $pid would not stop"
  fi
  use_lib_of "$dir"
  launch "$dir" "$port" || rc=$?
  if [ "$rc" = 0 ]; then
    publish "$dir" "$port" "$cport"
    return 0
  fi
  why_dead "$dir"
  bind_failed "$dir" && svc_die "port $port or $cport is taken by another process"
  [ "$rc" = 2 ] && svc_die "not ready within ${SPILLWAY_KAFKA_READY_TIMEOUT:-60} s (killed)"
  svc_die "the broker exited during start-up"
}

cmd_stop() {
  local dir
  [ -e "$1" ] || return 0
  dir=$(broker_dir "$1")
  svc_stop "$dir" PID PID_START "${SPILLWAY_KAFKA_STOP_TIMEOUT:-30}"
}

cmd_kill() {
  local dir
  dir=$(broker_dir "$1")
  svc_kill "$dir" PID PID_START broker
}

cmd_topic() {
  local dir name=$2 parts=$3 bootstrap pid start deadline meta n
  dir=$(broker_dir "$1")
  shift 3
  case $parts in ''|*[!0-9]*) svc_die "PARTITIONS must be a positive number" ;; esac
  bootstrap=$(svc_env_get "$dir/env" BOOTSTRAP)
  pid=$(svc_env_get "$dir/env" PID)
  start=$(svc_env_get "$dir/env" PID_START)
  svc_alive "$pid" "$start" || svc_die "no broker running in $dir"
  use_lib_of "$dir"
  run_tool "$dir" "$dir/topic.log" org.apache.kafka.tools.TopicCommand \
    --bootstrap-server "$bootstrap" --create --if-not-exists --topic "$name" \
    --partitions "$parts" --replication-factor 1 "$@" ||
    { cat "$dir/topic.log" >&2; svc_die "creating topic $name failed"; }
  # Usable once the metadata names a leader for every partition.
  deadline=$(( $(svc_now_ms) + 30000 ))
  while :; do
    meta=$(timeout 10 kcat -b "$bootstrap" -L -t "$name" -m 2 2>&1 || true)
    n=$(grep -cE '^ *partition [0-9]+, leader 1,' <<<"$meta" || true)
    [ "$n" = "$parts" ] && return 0
    if [ "$(svc_now_ms)" -ge "$deadline" ]; then
      echo "$meta" >&2
      svc_die "topic $name: $n of $parts partitions have a leader after 30 s"
    fi
    sleep 0.2
  done
}

[ $# -ge 1 ] || svc_usage
cmd=$1
shift
case $cmd in
  fetch)   [ $# = 0 ] || svc_usage; ensure_lib; echo "KAFKA_LIB=$LIB" ;;
  start)   [ $# = 1 ] || svc_usage; cmd_start "$1" ;;
  stop)    [ $# = 1 ] || svc_usage; cmd_stop "$1" ;;
  kill)    [ $# = 1 ] || svc_usage; cmd_kill "$1" ;;
  restart) [ $# = 1 ] || svc_usage; cmd_restart "$1" ;;
  topic)   [ $# -ge 3 ] || svc_usage; cmd_topic "$@" ;;
  -h|--help|help) svc_usage ;;
  *) svc_usage ;;
esac
