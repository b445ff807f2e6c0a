#!/usr/bin/env bash
# `make up` (after `make setup`): start the Stockade daemon on its embedded
# defaults (SQLite in /var/lib/stockade, 127.0.0.1:8700, gVisor by default)
# unless one already answers, then show code running on both tiers.
set -euo pipefail
cd "$(dirname "$0")/.."

addr=127.0.0.1:8700
log=/var/log/stockade.log
pidfile=/run/stockade/serve.pid

for driver in gvisor runc; do
	printf '%-7s pandas ' "$driver"
	# </dev/null: stockade run reads a piped stdin to its end for the
	# program, and whoever runs make up may hold a pipe open.
	stockade run --driver "$driver" --runtime python -c 'import pandas; print(pandas.__version__)' </dev/null
done

if curl -sf "http://$addr/healthz" >/dev/null 2>&1; then
	echo "stockade is already serving on $addr"
	exit 0
fi
# The log and the pid file are root's only (the log names workspaces and
# executions; the daemon makes an older log private too). Only they: the
# daemon keeps the caller's umask, as it makes files that sandboxes read.
(umask 077 && mkdir -p "$(dirname "$pidfile")" && : >>"$log" && : >"$pidfile")
nohup stockade serve --listen "$addr" >>"$log" 2>&1 &
echo $! >"$pidfile"
for _ in $(seq 1 50); do
	if curl -sf "http://$addr/healthz" >/dev/null 2>&1; then
		echo "stockade serving on http://$addr (pid $(cat "$pidfile"), log $log)"
		exit 0
	fi
	sleep 0.2
done
echo "stockade did not come up; see $log" >&2
exit 1
