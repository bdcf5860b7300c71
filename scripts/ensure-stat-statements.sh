#!/usr/bin/env bash
# For `make bench`: PostgreSQL's pg_stat_statements, which bench/cost.py reads for the
# statements that cost the most. The library must be preloaded, which takes a restart of the
# local cluster; a later run finds it loaded and does nothing.
set -uo pipefail

loaded=$(psql -h 127.0.0.1 -U postgres -tAc "SHOW shared_preload_libraries" postgres 2>/dev/null) || {
  echo "ensure-stat-statements: PostgreSQL does not answer at 127.0.0.1:5432"; exit 1; }
case ",${loaded// /}," in
  *,pg_stat_statements,*) exit 0 ;;
esac
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  echo "ensure-stat-statements: pg_stat_statements is not preloaded and this is no local Debian cluster;"
  echo "  add it to shared_preload_libraries and restart PostgreSQL for bench/cost.py's statement table"
  exit 0
fi
wanted=${loaded:+$loaded,}pg_stat_statements
echo "ensure-stat-statements: preloading pg_stat_statements (ALTER SYSTEM SET shared_preload_libraries = '$wanted') and restarting PostgreSQL"
psql -h 127.0.0.1 -U postgres -qc "ALTER SYSTEM SET shared_preload_libraries = '$wanted'" postgres
pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main restart || true
pg_isready -q -h 127.0.0.1 -p 5432 -t 60 || { echo "PostgreSQL did not come back"; exit 1; }
