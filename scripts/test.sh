#!/usr/bin/env bash
# `make test` (after `make setup`): starts the services the tests need —
# a throwaway PostgreSQL and a private dockerd — runs the whole suite on
# them, and stops them again, whatever the outcome.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d /tmp/stockade-test.XXXXXX)
# PostgreSQL runs as its own user and must reach its directory.
chmod 755 "$work"
pg="$work/pg"
dockerdir="$work/docker"
cleanup() {
	scripts/pgtest.sh stop "$pg" >/dev/null 2>&1 || true
	scripts/dockerd.sh stop "$dockerdir" >/dev/null 2>&1 || true
	rm -rf "$work" 2>/dev/null || true
}
trap cleanup EXIT

# A port of its own, so that a PostgreSQL already on the default one does
# not get in the way.
export PGTEST_PORT=${PGTEST_PORT:-$((20000 + RANDOM % 20000))}
STOCKADE_TEST_POSTGRES=$(scripts/pgtest.sh start "$pg")
export STOCKADE_TEST_POSTGRES
if [ -x scripts/dockerd.sh ]; then
	STOCKADE_TEST_DOCKER_HOST=$(scripts/dockerd.sh start "$dockerdir")
	export STOCKADE_TEST_DOCKER_HOST
fi

# -p 2: two packages at a time on two cores; the conformance suites fork-bomb
# and fill memory on purpose, and more parallelism only adds noise.
go test -count=1 -p 2 -timeout 25m "$@" ./...
