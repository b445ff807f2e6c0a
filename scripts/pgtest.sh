#!/usr/bin/env bash
# pgtest.sh runs a throwaway PostgreSQL cluster for Stockade's store tests.
#
#   scripts/pgtest.sh [start] [DIR]   install PostgreSQL if needed, initialise a
#                                     cluster under DIR (default /tmp/stockade-pg),
#                                     start it on 127.0.0.1:$PGTEST_PORT (default
#                                     55432) and print its DSN on stdout
#   scripts/pgtest.sh stop [DIR]      stop that cluster (DIR is left in place)
#   scripts/pgtest.sh dsn [DIR]       print the DSN without starting anything
#
# Every step is idempotent: running start twice reuses the cluster and the
# database. Typical use:
#
#   export STOCKADE_TEST_POSTGRES=$(scripts/pgtest.sh)
#   go test ./store/...
#   scripts/pgtest.sh stop
#
# The cluster trusts every local connection and runs with fsync off: it is for
# tests only. Progress goes to stderr so that stdout carries the DSN alone.
set -euo pipefail

cmd=start
case "${1:-}" in
start | stop | dsn) cmd=$1; shift ;;
esac
dir=${1:-/tmp/stockade-pg}
port=${PGTEST_PORT:-55432}
dbname=stockade_test
pguser=postgres

log() { echo "pgtest: $*" >&2; }

dsn() { echo "postgres://postgres@127.0.0.1:${port}/${dbname}?sslmode=disable"; }

# bindir prints the directory holding initdb, pg_ctl and postgres, preferring
# Debian's PostgreSQL 15 layout, then the newest Debian major, then PATH.
bindir() {
	if [ -x /usr/lib/postgresql/15/bin/pg_ctl ]; then
		echo /usr/lib/postgresql/15/bin
		return 0
	fi
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	if [ -n "$d" ] && [ -x "$d/pg_ctl" ]; then
		echo "$d"
		return 0
	fi
	if command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(readlink -f "$(command -v pg_ctl)")"
		return 0
	fi
	return 1
}

install_postgres() {
	[ "$(id -u)" -eq 0 ] || { log "PostgreSQL is missing and installing it needs root"; exit 1; }
	log "installing Debian's postgresql package"
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y -q postgresql >&2; then
		log "apt-get install failed; updating the package lists and retrying"
		apt-get update -q >&2
		apt-get install -y -q postgresql >&2
	fi
}

# as_pg runs a command as the cluster's owner: initdb and postgres refuse root.
as_pg() {
	if [ "$(id -u)" -ne 0 ]; then
		"$@"
	elif command -v runuser >/dev/null 2>&1; then
		runuser -u "$pguser" -- "$@"
	else
		su -s /bin/sh "$pguser" -c "$(printf '%q ' "$@")"
	fi
}

pg_running() { [ -f "$dir/data/PG_VERSION" ] && as_pg "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; }

case "$cmd" in
dsn)
	dsn
	exit 0
	;;
stop)
	if bin=$(bindir) && pg_running; then
		log "stopping the cluster in $dir"
		as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2
	else
		log "no cluster running in $dir"
	fi
	exit 0
	;;
esac

# As root the cluster runs as user postgres, which Debian's package creates.
if ! bin=$(bindir) || { [ "$(id -u)" -eq 0 ] && ! id -u "$pguser" >/dev/null 2>&1; }; then
	install_postgres
	bin=$(bindir)
fi

if [ "$(id -u)" -eq 0 ]; then
	mkdir -p "$dir"
	chown "$pguser": "$dir"
	chmod 700 "$dir"
	as_pg test -w "$dir" || { log "$dir is not reachable by user $pguser (check the parent directories' permissions)"; exit 1; }
else
	pguser=$(id -un)
	mkdir -p "$dir"
fi

if [ ! -f "$dir/data/PG_VERSION" ]; then
	log "initialising a cluster in $dir/data with $bin/initdb"
	as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 ||
		{ cat "$dir/initdb.log" >&2; exit 1; }
fi

if ! pg_running; then
	log "starting PostgreSQL on 127.0.0.1:$port (socket and log in $dir)"
	as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
		-o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
		start >&2 || { tail -n 20 "$dir/postgres.log" >&2; exit 1; }
fi

psql=$bin/psql
[ -x "$psql" ] || psql=$(command -v psql)
exists=$(as_pg "$psql" -h "$dir" -p "$port" -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$dbname'")
if [ "$exists" != 1 ]; then
	log "creating database $dbname"
	as_pg "$psql" -h "$dir" -p "$port" -U postgres -d postgres -qc "CREATE DATABASE $dbname" >&2
fi

dsn
