#!/usr/bin/env bash
# Installs what pip cannot.
#   system-deps.sh build: a C compiler and Python's headers, for txlog's C part (app/_native.c;
#     without them txlog installs and runs on the Python definitions alone, slower).
#   system-deps.sh: also Java and the PostgreSQL JDBC driver (for Spark), Chromium (for page
#     tests), libfaketime (runs a server with its clock set apart from the database's, for clock
#     tests), kcat (a librdkafka command-line client, for the Kafka gateway's smoke test) and
#     Node.js with npm (RocketMQ's Node.js client, installed by its test under .cache/node), and
#     Patroni with etcd (the automatic failover tests run a Patroni cluster of the bundled
#     PostgreSQL, tests/replication/test_patroni_failover.py).
# Skips what is present; says what is missing when it cannot install (no root, no apt).
set -euo pipefail
python=${PYTHON:-python3}
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
"$python" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  2>/dev/null || need+=(python3-dev)
if [[ ${1:-} != build ]]; then
  command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
  [[ -f /usr/share/java/postgresql.jar || -n "${TXLOG_JDBC_JAR:-}" ]] || need+=(libpostgresql-jdbc-java)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v faketime >/dev/null 2>&1 || need+=(faketime)
  command -v kcat >/dev/null 2>&1 || need+=(kcat)
  command -v node >/dev/null 2>&1 || need+=(nodejs)
  command -v npm >/dev/null 2>&1 || need+=(npm)
  command -v patroni >/dev/null 2>&1 || need+=(patroni)
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
fi
((${#need[@]})) || exit 0
if [[ ${1:-} == build ]] && [[ $(id -u) -ne 0 ]] && ! sudo -n true 2>/dev/null; then
  # Never stop `make run` at a password prompt for what is optional.
  echo "warning: please install ${need[*]}; until then txlog runs without its C part (slower)" >&2
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "installing ${need[*]} with apt-get" >&2
  $sudo apt-get update -qq >/dev/null || true
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null \
    || [[ ${1:-} == build ]] || exit 1
else
  echo "warning: please install ${need[*]} (the C part, Spark, browser, clock, Kafka-client and failover tests need them)" >&2
fi
