#!/usr/bin/env bash
# Installs Apache Kafka (broker, KRaft controller and tools) from Maven Central jars into the
# cache. Idempotent: does nothing when the jars are already there.
source "$(dirname "$0")/lib.sh"

command -v java >/dev/null || die "java is not installed (Kafka needs Java 17+)"
command -v mvn >/dev/null || die "mvn is not installed (used to fetch Kafka's jars)"

if [[ -f $KAFKA_HOME/.complete ]]; then
  log "kafka $KAFKA_VERSION already installed in $KAFKA_HOME"
  exit 0
fi
log "installing kafka $KAFKA_VERSION into $KAFKA_HOME"
rm -rf "$KAFKA_HOME"
mkdir -p "$KAFKA_HOME/libs"
mvn -B -q -f "$DEV_DIR/kafka/pom.xml" \
  -Dmaven.repo.local="$STREAMAPP_CACHE/m2" \
  -Dkafka.version="$KAFKA_VERSION" \
  dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$KAFKA_HOME/libs" ||
  die "could not resolve kafka $KAFKA_VERSION jars with maven"
touch "$KAFKA_HOME/.complete"
log "kafka $KAFKA_VERSION installed ($(ls "$KAFKA_HOME/libs" | wc -l) jars)"
