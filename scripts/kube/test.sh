#!/usr/bin/env bash
# Runs the kubernetes driver's cluster tests (build tag kubecluster,
# driver/kubernetes/cluster_test.go) on the test cluster, twice, and
# leaves nothing running:
#
#   1. up.sh with the kubelet's podPidsLimit 64 (the conformance suite's
#      pids limit): the suite on runc pods (RuntimeClass runc-nonet), the
#      round trip, reaping, the network probes and the termination log;
#   2. down.sh, then up.sh with podPidsLimit 320 (a gVisor pod's Sentry
#      counts in its pids cgroup: the program's 64 plus 256): the suite
#      on gVisor pods (gvisor-nonet), the termination log there, and the
#      README's API example and a session (state, files, a PNG) against
#      `stockade serve` with STOCKADE_DRIVER=kubernetes, whose daemon is
#      then killed and restarted to reap its run's and its session's pods
#      and end the session with the reason (TestClusterDaemon); the
#      daemon's manifests applied with a server dry run, and the daemon
#      run as a pod of serve.yaml (TestClusterDeploy*); then bench/kube's
#      smoke run (one round of each variant);
#   3. down.sh, also when a step fails (trap).
#
# Needs root and the binaries scripts/kube/build.sh caches (it does not
# build them: on a fresh machine run build.sh first, ~20 min from empty
# Go caches, see docs/kubernetes.md), and the runtime images `shell` and
# `python` in $STOCKADE_DATA_DIR (/var/lib/stockade by default, `stockade
# setup`).
# Exits non-zero if a test failed or down.sh left anything. Prints each
# step's time. Extra `go test` flags: $KUBE_TEST_FLAGS (e.g. -v).
#
# $KUBE_TEST_SKIP, a `go test -skip` pattern, skips tests (none by
# default). What no pod spec can give (an emptyDir without nosuid, the
# kubelet's files of the node) is declared as the kubernetes driver's
# differences in sandbox/profile, which the suite asserts instead.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
CACHE=${STOCKADE_KUBE_CACHE:-/usr/local/lib/stockade}
KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
envfile=$CACHE/kube-cluster-$KUBE_VERSION.env
[ -r "$envfile" ] || { echo "test.sh: $envfile missing; run scripts/kube/build.sh first" >&2; exit 1; }
# shellcheck disable=SC1090
. "$envfile"
DIR=${STOCKADE_KUBE_DIR:-/var/lib/stockade-kube}
[ "$(id -u)" = 0 ] || { echo "test.sh: needs root" >&2; exit 1; }

log() { printf '%s test.sh: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
now() { date +%s.%N; }
since() { echo "$(now) $1" | awk '{printf "%.1f", $1 - $2}'; }

export PATH=/usr/local/go/bin:$PATH CGO_ENABLED=0 GOFLAGS=${GOFLAGS:--buildvcs=false}
export STOCKADE_TEST_KUBECONFIG=$DIR/admin.kubeconfig
export STOCKADE_TEST_KUBE_CTR="$CONTAINERD_BIN/ctr --address $DIR/run/containerd.sock"
export STOCKADE_TEST_KUBE_RUNSC=$RUNSC
# up.sh's registry: $STOCKADE_KUBE_PREFIX.1:$STOCKADE_KUBE_REGISTRY_PORT.
export STOCKADE_TEST_KUBE_REGISTRY=${STOCKADE_KUBE_PREFIX:-10.250.250}.1:${STOCKADE_KUBE_REGISTRY_PORT:-5000}
# The kubelet's seccomp directory under up.sh's $DIR (its root is
# $DIR/kubelet), where the tests and the bench write Stockade's filter.
export STOCKADE_TEST_KUBE_SECCOMP_DIR=$DIR/kubelet/seccomp

skip=${KUBE_TEST_SKIP:-}
up=0
down() {
	[ "$up" = 1 ] || return 0
	local t
	t=$(now)
	if "$here/down.sh" >/dev/null; then
		log "down.sh: $(since "$t") s"
		up=0
	else
		log "down.sh left something (above)"
		return 1
	fi
}
trap 'down' EXIT

# run PIDS_LIMIT PATTERN [COMMAND...]: brings the cluster up with that
# podPidsLimit, runs the tests PATTERN names and then COMMAND, if given
# (a benchmark's smoke run, on the same cluster), from the repository's
# root, and tears the cluster down.
failed=0
run() {
	local t rc
	t=$(now)
	STOCKADE_KUBE_POD_PIDS_LIMIT=$1 "$here/up.sh" >/dev/null || { log "up.sh failed"; failed=1; return; }
	up=1
	log "up.sh (podPidsLimit $1): $(since "$t") s"
	t=$(now)
	# shellcheck disable=SC2086
	(cd "$root" && nice go test -tags kubecluster -count=1 -p 1 -timeout 20m ${KUBE_TEST_FLAGS:-} -run "$2" ${skip:+-skip "$skip"} ./driver/kubernetes/)
	rc=$?
	log "go test -run '$2': $(since "$t") s, exit $rc"
	[ "$rc" = 0 ] || failed=1
	if [ $# -gt 2 ]; then
		t=$(now)
		(cd "$root" && nice "${@:3}")
		rc=$?
		log "${*:3}: $(since "$t") s, exit $rc"
		[ "$rc" = 0 ] || failed=1
	fi
	down || failed=1
}

t0=$(now)
run 64 'TestClusterConformanceRunc|TestClusterRoundTrip/container|TestClusterReap|TestClusterNoNetwork|TestClusterTerminationLog/container|TestClusterRegistry|TestClusterPool'
# bench/kube's smoke run, the least work its flags allow (judging no
# figure; scripts/test.sh's bench_smoke leaves it to this phase).
run 320 'TestClusterConformanceGVisor|TestClusterRoundTrip/gvisor|TestClusterTerminationLog/gvisor|TestClusterDaemon|TestClusterDeploy' \
	go run ./bench/kube -n 1 -cells 1 -pods 1 -concurrency 1 -seccomp-dir "$STOCKADE_TEST_KUBE_SECCOMP_DIR"
log "all: $(since "$t0") s, $([ "$failed" = 0 ] && echo passed || echo FAILED)"
exit "$failed"
