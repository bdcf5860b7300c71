#!/usr/bin/env bash
# Make sure the services the tests talk to answer: PostgreSQL, MariaDB, RabbitMQ.
# On this machine kind they run before the session; if one stopped, start it with the
# machine's own start command, installing the Debian package first if it is missing.
set -uo pipefail

wait_port() { # host port seconds
  local deadline=$((SECONDS + $3))
  while (( SECONDS < deadline )); do
    (echo > "/dev/tcp/$1/$2") >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}

need_pkg() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "ensure-services: installing $2"
  [ -n "${_APT_UPDATED:-}" ] || { apt-get update -qq; _APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

status=0

if ! wait_port 127.0.0.1 5432 1; then
  echo "ensure-services: starting PostgreSQL"
  need_pkg pg_ctlcluster postgresql
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  wait_port 127.0.0.1 5432 60 || { echo "PostgreSQL did not start"; status=1; }
fi

if ! wait_port 127.0.0.1 3306 1; then
  echo "ensure-services: starting MariaDB"
  need_pkg mariadbd mariadb-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
  wait_port 127.0.0.1 3306 60 || { echo "MariaDB did not start"; status=1; }
fi

if ! wait_port 127.0.0.1 5672 1; then
  echo "ensure-services: starting RabbitMQ"
  need_pkg rabbitmq-server rabbitmq-server
  rabbitmq-server -detached || true
  wait_port 127.0.0.1 5672 120 || { echo "RabbitMQ did not start"; status=1; }
fi

# The parallel suite (make test: TEST_WORKERS processes, each starting relays and workers with
# their own pools) needs more connections than PostgreSQL's default 100: peaks of 80-90 were
# seen with 4 processes. Raise it once on the local cluster (ALTER SYSTEM, then a restart);
# a later run finds it set and does nothing.
PG_MIN_CONNECTIONS=${PG_MIN_CONNECTIONS:-300}
current=$(psql -h 127.0.0.1 -U postgres -tAc "SHOW max_connections" postgres 2>/dev/null || echo "")
if [ -n "$current" ] && (( current < PG_MIN_CONNECTIONS )); then
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    echo "ensure-services: PostgreSQL max_connections is $current; setting $PG_MIN_CONNECTIONS (ALTER SYSTEM) and restarting it"
    psql -h 127.0.0.1 -U postgres -qc "ALTER SYSTEM SET max_connections = $PG_MIN_CONNECTIONS" postgres
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main restart || true
    wait_port 127.0.0.1 5432 60 || { echo "PostgreSQL did not come back"; status=1; }
  else
    echo "ensure-services: PostgreSQL max_connections is $current (< $PG_MIN_CONNECTIONS) and this is no local Debian cluster: run make test with TEST_WORKERS=2"
  fi
fi

# Autovacuum: this machine kind's PostgreSQL ships it off (a conf.d file); production runs
# PostgreSQL's default, on, and the tests should meet the database users run. ALTER SYSTEM
# outranks conf.d, and autovacuum needs only a reload; a later run finds it on and says nothing.
autovacuum=$(psql -h 127.0.0.1 -U postgres -tAc "SHOW autovacuum" postgres 2>/dev/null || echo "")
if [ "$autovacuum" = "off" ]; then
  echo "ensure-services: PostgreSQL autovacuum is off; turning it on (ALTER SYSTEM SET autovacuum = on, reload), as production runs it"
  psql -h 127.0.0.1 -U postgres -qc "ALTER SYSTEM SET autovacuum = on" postgres
  psql -h 127.0.0.1 -U postgres -qtAc "SELECT pg_reload_conf()" postgres >/dev/null
fi

# The databases the tests use must exist (trust auth / root without password).
psql -h 127.0.0.1 -U postgres -tAc "SELECT 1" postgres >/dev/null 2>&1 || {
  echo "PostgreSQL does not accept postgres@127.0.0.1 (trust auth expected)"; status=1; }
mariadb -h 127.0.0.1 -uroot -e "CREATE DATABASE IF NOT EXISTS test" >/dev/null 2>&1 || {
  echo "MariaDB does not accept root@127.0.0.1 without password"; status=1; }

exit $status
