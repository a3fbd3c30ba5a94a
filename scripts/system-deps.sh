#!/usr/bin/env bash
# Installs what pip cannot: Java and the PostgreSQL JDBC driver (for Spark), Chromium (for page
# tests), libfaketime (runs a server with its clock set apart from the database's, for clock tests)
# and kcat (a librdkafka command-line client, for the Kafka gateway's smoke test).
# Skips what is present; says what is missing when it cannot install (no root, no apt).
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
[[ -f /usr/share/java/postgresql.jar || -n "${TXLOG_JDBC_JAR:-}" ]] || need+=(libpostgresql-jdbc-java)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v faketime >/dev/null 2>&1 || need+=(faketime)
command -v kcat >/dev/null 2>&1 || need+=(kcat)
((${#need[@]})) || exit 0
if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "installing ${need[*]} with apt-get" >&2
  $sudo apt-get update -qq >/dev/null || true
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
else
  echo "warning: please install ${need[*]} (Spark, browser, clock and Kafka-client tests need them)" >&2
fi
