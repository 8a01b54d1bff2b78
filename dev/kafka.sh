#!/usr/bin/env bash
# Starts or stops the local single-node Apache Kafka (KRaft: combined broker + controller).
#   dev/kafka.sh start|stop|status
#   dev/kafka.sh tool <class> <args...>   one of Kafka's command-line tools against the broker,
#                                          e.g. org.apache.kafka.tools.TransactionsCommand
# Data, config and the log live in $STREAMAPP_RUN/kafka. The broker runs in the test bed's network
# namespace (dev/net.sh) with three listeners: 127.0.0.1:$KAFKA_PORT (its loopback: tests, tools,
# and this machine's loopback through the relay), $HUB_IP:$KAFKA_POD_PORT for the pods, and
# SASL_SSL on 127.0.0.1:$KAFKA_SECURE_PORT for the tests of secured connections (a CA of its own
# made here with openssl, SASL PLAIN and SCRAM-SHA-256/512 for the user in $dir/tls/user), and
# an ACL authorizer.
source "$(dirname "$0")/lib.sh"

dir="$STREAMAPP_RUN/kafka"
pidfile="$dir/kafka.pid"
logfile="$dir/kafka.log"
tls="$dir/tls"
# The secure listener's test user (SASL PLAIN and SCRAM): test credentials, nothing else.
sasl_user=streamapp
sasl_password=streamapp-test-secret

# The JVM command line shared by the broker and the storage tool.
kafka_java=(java -Xms512m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true
  -Dlog4j2.configurationFile="$dir/log4j2.properties" -cp "$KAFKA_HOME/libs/*")

# A CA and a server certificate for 127.0.0.1 (kept while they exist), the PEM key store the
# broker reads, and the user's credentials in a file the tests read.
write_tls() {
  mkdir -p "$tls"
  if [[ ! -f $tls/server.pem ]]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=streamapp test bed CA" \
      -keyout "$tls/ca.key" -out "$tls/ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
      -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$tls/san.ext"
    openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial \
      -days 3650 -extfile "$tls/san.ext" -out "$tls/server.crt" 2>/dev/null
    # Kafka's PEM key store: an unencrypted PKCS#8 key, then the certificate chain.
    openssl pkcs8 -topk8 -nocrypt -in "$tls/server.key" >"$tls/server.pem.tmp"
    cat "$tls/server.crt" "$tls/ca.crt" >>"$tls/server.pem.tmp"
    mv "$tls/server.pem.tmp" "$tls/server.pem"
  fi
  printf '%s\n%s\n' "$sasl_user" "$sasl_password" >"$tls/user"
}

write_config() {
  mkdir -p "$dir/data"
  write_tls
  cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
# Each listener advertises its own address, so a client keeps talking to the address it used.
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,PODS://$HUB_IP:$KAFKA_POD_PORT,SECURE://127.0.0.1:$KAFKA_SECURE_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,PODS://$HUB_IP:$KAFKA_POD_PORT,SECURE://127.0.0.1:$KAFKA_SECURE_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PODS:PLAINTEXT,SECURE:SASL_SSL
listener.name.secure.ssl.keystore.type=PEM
listener.name.secure.ssl.keystore.location=$tls/server.pem
listener.name.secure.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.secure.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$sasl_user="$sasl_password";
listener.name.secure.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.secure.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
# ACLs as a secured cluster has them: the plain listeners' principal (User:ANONYMOUS: tests,
# tools, pods) may do anything; the secure listener's user may do what no ACL restricts, so
# a test can take a permission away from it on a topic of its own.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS
allow.everyone.if.no.acl.found=true
log.dirs=$dir/data
# One broker: every internal topic has one replica, so transactions and groups work.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Topics are created on purpose (the processor creates and validates its changelog).
auto.create.topics.enable=false
num.partitions=1
# Tests kill processors on purpose: let the broker notice dead members and open
# transactions quickly.
group.consumer.min.session.timeout.ms=1000
group.classic.min.session.timeout.ms=1000
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000
# The log cleaner looks for compactable logs every second instead of every 15 (a test
# compacts a changelog and rebuilds a store from it).
log.cleaner.backoff.ms=1000
PROPS
  cat >"$dir/log4j2.properties" <<PROPS
rootLogger.level=INFO
rootLogger.appenderRef.stdout.ref=STDOUT
appender.stdout.type=Console
appender.stdout.name=STDOUT
appender.stdout.layout.type=PatternLayout
appender.stdout.layout.pattern=[%d] %p %m (%c)%n
logger.kafka.name=kafka
logger.kafka.level=WARN
logger.apache.name=org.apache.kafka
logger.apache.level=WARN
logger.started.name=kafka.server.KafkaRaftServer
logger.started.level=INFO
PROPS
}

broker_answers() {
  # The port is open and the server logged that it finished starting.
  in_testbed bash -c "exec 3<>/dev/tcp/127.0.0.1/$KAFKA_PORT" 2>/dev/null && grep -q "Kafka Server started" "$logfile"
}

start() {
  [[ -f $KAFKA_HOME/.complete ]] || die "kafka is not installed: run 'make setup' (or dev/install-kafka.sh)"
  [[ -e $NETNS_PATH ]] || die "the test bed's network namespace is missing: run 'make up' (or dev/net.sh start first)"
  if pid_alive "$pidfile"; then
    log "kafka already running (pid $(cat "$pidfile")) on 127.0.0.1:$KAFKA_PORT"
    return
  fi
  write_config
  if [[ ! -f $dir/data/meta.properties ]]; then
    log "formatting kafka storage in $dir/data"
    local cluster_id
    cluster_id=$("${kafka_java[@]}" kafka.tools.StorageTool random-uuid)
    # The SCRAM credentials of the secure listener's user go into the metadata log here.
    "${kafka_java[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" \
      --add-scram "SCRAM-SHA-256=[name=$sasl_user,password=$sasl_password]" \
      --add-scram "SCRAM-SHA-512=[name=$sasl_user,password=$sasl_password]" \
      >"$dir/format.log" 2>&1 || { cat "$dir/format.log" >&2; die "formatting kafka storage failed"; }
    touch "$dir/data/.scram-users"
  fi
  log "starting kafka $KAFKA_VERSION on 127.0.0.1:$KAFKA_PORT (log: $logfile)"
  : >"$logfile"
  nohup nsenter --net="$NETNS_PATH" -- "${kafka_java[@]}" kafka.Kafka "$dir/server.properties" >>"$logfile" 2>&1 &
  echo $! >"$pidfile"
  wait_until 120 "kafka" "$logfile" broker_answers
  if [[ ! -f $dir/data/.scram-users ]]; then
    # Storage formatted before the secure listener existed: add the user's credentials now.
    for mechanism in SCRAM-SHA-256 SCRAM-SHA-512; do
      in_testbed java -Xmx256m -Djava.awt.headless=true -Dlog4j2.configurationFile="$dir/log4j2.properties" \
        -cp "$KAFKA_HOME/libs/*" org.apache.kafka.tools.ConfigCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" \
        --alter --entity-type users --entity-name "$sasl_user" \
        --add-config "$mechanism=[password=$sasl_password]" >>"$dir/format.log" 2>&1 ||
        { tail -20 "$dir/format.log" >&2; die "adding the SCRAM user failed"; }
    done
    touch "$dir/data/.scram-users"
  fi
  log "kafka is up: bootstrap servers 127.0.0.1:$KAFKA_PORT (pods: $HUB_IP:$KAFKA_POD_PORT; SASL_SSL: 127.0.0.1:$KAFKA_SECURE_PORT)"
}

case "${1:-}" in
  start) start ;;
  stop) stop_pid kafka "$pidfile" ;;
  status) pid_alive "$pidfile" && echo "kafka running (pid $(cat "$pidfile"))" || echo "kafka stopped" ;;
  tool)
    shift
    [ $# -ge 1 ] || die "usage: $0 tool <class> <args...>"
    class="$1"
    shift
    exec java -Xmx256m -Djava.awt.headless=true -Dlog4j2.configurationFile="$dir/log4j2.properties" \
      -cp "$KAFKA_HOME/libs/*" "$class" --bootstrap-server "127.0.0.1:$KAFKA_PORT" "$@"
    ;;
  *) die "usage: $0 start|stop|status|tool <class> <args...>" ;;
esac
