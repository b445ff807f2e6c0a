#!/usr/bin/env bash
# clickhousetest.sh runs a throwaway ClickHouse server for Stockade's
# analytics tests.
#
#   scripts/clickhousetest.sh [start] [DIR]   install clickhouse-server if needed,
#                                             write a minimal configuration under DIR
#                                             (default /tmp/stockade-clickhouse), start
#                                             the server on 127.0.0.1:$CLICKHOUSETEST_PORT
#                                             (default: a free port) and print its URL on
#                                             stdout
#   scripts/clickhousetest.sh stop [DIR]      stop that server (DIR is left in place)
#   scripts/clickhousetest.sh url [DIR]       print the URL without starting anything
#
# Every step is idempotent: start on a running server prints its URL, and a
# start after a stop reuses DIR's configuration (its port) and its data, as a
# restarted production server would. Typical use:
#
#   export STOCKADE_TEST_CLICKHOUSE=$(scripts/clickhousetest.sh)
#   go test ./analytics/...
#   scripts/clickhousetest.sh stop
#
# The server listens on 127.0.0.1 only, on its HTTP port only (no native,
# interserver or TLS port), with small caches, no system log tables and one
# user, default, without a password: it is for tests only. Progress goes to
# stderr so that stdout carries the URL alone.
set -euo pipefail

cmd=start
case "${1:-}" in
start | stop | url) cmd=$1; shift ;;
esac
dir=${1:-/tmp/stockade-clickhouse}
server=/usr/sbin/clickhouse-server

log() { echo "clickhousetest: $*" >&2; }

# port prints the port DIR's configuration names.
port() { sed -n 's:.*<http_port>\([0-9]*\)</http_port>.*:\1:p' "$dir/config.xml" 2>/dev/null; }

# free_port prints $CLICKHOUSETEST_PORT, or a loopback port nothing listens on.
free_port() {
	if [ -n "${CLICKHOUSETEST_PORT:-}" ]; then
		echo "$CLICKHOUSETEST_PORT"
		return 0
	fi
	local p
	for _ in $(seq 100); do
		p=$((20000 + RANDOM % 20000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	log "found no free port; set CLICKHOUSETEST_PORT"
	return 1
}

url() { echo "http://127.0.0.1:$(port)"; }

running() {
	[ -f "$dir/server.pid" ] && kill -0 "$(cat "$dir/server.pid")" 2>/dev/null
}

case "$cmd" in
url)
	[ -f "$dir/config.xml" ] || { log "no server configured in $dir; run: $0 start $dir"; exit 1; }
	url
	exit 0
	;;
stop)
	if running; then
		pid=$(cat "$dir/server.pid")
		log "stopping the server in $dir (pid $pid)"
		kill "$pid"
		for _ in $(seq 300); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			log "the server did not stop within 30 s; killing it"
			kill -9 "$pid" 2>/dev/null || true
		fi
		rm -f "$dir/server.pid"
	else
		log "no server running in $dir"
	fi
	exit 0
	;;
esac

if [ ! -x "$server" ]; then
	[ "$(id -u)" -eq 0 ] || { log "clickhouse-server is missing and installing it needs root"; exit 1; }
	log "installing Debian's clickhouse-server package"
	export DEBIAN_FRONTEND=noninteractive
	# policy-rc.d keeps the package from starting the system-wide server
	# (where it is honoured): only the throwaway one below should run.
	if ! apt-get install -y -q clickhouse-server >&2; then
		log "apt-get install failed; updating the package lists and retrying"
		apt-get update -q >&2
		apt-get install -y -q clickhouse-server >&2
	fi
fi

if running; then
	url
	exit 0
fi

mkdir -p "$dir/data"
if [ ! -f "$dir/config.xml" ]; then
	p=$(free_port)
	log "configuring a server in $dir on 127.0.0.1:$p"
	cat >"$dir/config.xml" <<EOF
<?xml version="1.0"?>
<yandex>
    <logger>
        <level>warning</level>
        <log>$dir/server.log</log>
        <errorlog>$dir/server.err.log</errorlog>
        <size>10M</size>
        <count>1</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>$p</http_port>
    <path>$dir/data/</path>
    <tmp_path>$dir/data/tmp/</tmp_path>
    <user_files_path>$dir/data/user_files/</user_files_path>
    <format_schema_path>$dir/data/format_schemas/</format_schema_path>
    <users_config>$dir/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mark_cache_size>67108864</mark_cache_size>
    <uncompressed_cache_size>67108864</uncompressed_cache_size>
    <max_concurrent_queries>32</max_concurrent_queries>
</yandex>
EOF
	cat >"$dir/users.xml" <<'EOF'
<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>1000000000</max_memory_usage>
            <background_pool_size>2</background_pool_size>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas><default></default></quotas>
</yandex>
EOF
fi

log "starting clickhouse-server on $(url) (data and logs in $dir)"
# --daemon writes its stdout and stderr files to the working directory.
(cd "$dir" && "$server" --config-file="$dir/config.xml" --pid-file="$dir/server.pid" --daemon)
for _ in $(seq 300); do
	if [ "$(curl -sf "$(url)/ping" 2>/dev/null)" = "Ok." ]; then
		url
		exit 0
	fi
	sleep 0.1
done
log "the server did not answer within 30 s"
tail -n 20 "$dir/server.err.log" >&2 2>/dev/null || true
exit 1
