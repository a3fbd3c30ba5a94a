#!/bin/sh
# Run once by Patroni on the node that initialised the cluster, with a superuser connection string:
# txlog's role and database, and the role standbys replicate with.
set -e
psql "$1" -v ON_ERROR_STOP=1 \
  -c "CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD '${PATRONI_REPLICATION_PASSWORD}'" \
  -c "CREATE ROLE txlog LOGIN PASSWORD '${TXLOG_DB_PASSWORD}'" \
  -c "CREATE DATABASE txlog OWNER txlog"
