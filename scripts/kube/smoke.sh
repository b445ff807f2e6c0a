#!/usr/bin/env bash
# Proves a cluster from up.sh runs pods on both runtimes: for runc (no
# RuntimeClass), gVisor (RuntimeClass gvisor) and gVisor without a network
# (gvisor-nonet, which must show the container no device but lo) it creates a pod shaped
# like a sandbox's (non-root, no capabilities, read-only root, no service
# account token, no privilege escalation, seccomp RuntimeDefault) whose one
# container echoes each stdin line back, waits for it to be Ready, carries a
# line both ways over `kubectl attach -i`, and deletes it. Prints the times
# (create to Ready, attach round trip, delete) per runtime.
#
# The image is one static busybox (Debian's busybox-static, installed by
# build.sh), imported with ctr: the cluster reaches no registry.
set -euo pipefail

CACHE=${STOCKADE_KUBE_CACHE:-/usr/local/lib/stockade}
KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
# shellcheck disable=SC1090
. "$CACHE/kube-cluster-$KUBE_VERSION.env"
DIR=${STOCKADE_KUBE_DIR:-/var/lib/stockade-kube}
IMAGE=stockade.invalid/busybox:smoke
ROUNDS=${SMOKE_ROUNDS:-1}

log() { printf '%s smoke.sh: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
k() { "$KUBE_BIN/kubectl" --kubeconfig "$DIR/admin.kubeconfig" "$@"; }
ctr() { "$CONTAINERD_BIN/ctr" --address "$DIR/run/containerd.sock" -n k8s.io "$@"; }
now() { date +%s.%N; }
since() { echo "$(now) $1" | awk '{printf "%.2f", $1 - $2}'; }

# The image, as a docker-archive tar ctr names from RepoTags.
if ! ctr images ls -q | grep -x "$IMAGE" >/dev/null; then
	w=$(mktemp -d)
	mkdir -p "$w/rootfs/bin" "$w/img"
	cp /bin/busybox "$w/rootfs/bin/busybox"
	ln -s busybox "$w/rootfs/bin/sh"
	tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$w/rootfs" -cf "$w/img/layer.tar" bin
	diff=$(sha256sum "$w/img/layer.tar" | cut -d' ' -f1)
	printf '{"architecture":"amd64","os":"linux","config":{"Cmd":["/bin/sh"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}\n' "$diff" >"$w/img/config.json"
	printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]\n' "$IMAGE" >"$w/img/manifest.json"
	tar -C "$w/img" -cf "$w/image.tar" manifest.json config.json layer.tar
	ctr images import "$w/image.tar" >/dev/null
	rm -rf "$w"
	log "imported $IMAGE"
fi

# pod NAME RUNTIMECLASS: a sandbox-shaped pod whose container echoes lines.
pod() {
	local rc=""
	[ -z "$2" ] || rc="runtimeClassName: $2"
	cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  labels: {app: stockade-smoke}
spec:
  $rc
  automountServiceAccountToken: false
  enableServiceLinks: false
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  securityContext:
    runAsNonRoot: true
    runAsUser: 65534
    runAsGroup: 65534
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: c
    image: $IMAGE
    imagePullPolicy: Never
    stdin: true
    command:
    - /bin/sh
    - -c
    - |
      while read -r l; do
        if [ "\$l" = net ]; then
          echo "net: \$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' ')"
        else
          echo "echo: \$l"
        fi
      done
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
    resources:
      limits: {cpu: 500m, memory: 128Mi}
EOF
}

fail=0
for round in $(seq 1 "$ROUNDS"); do
	for rt in runc gvisor gvisor-nonet; do
		name=smoke-$rt-$round
		rc=""
		[ "$rt" = runc ] || rc=$rt
		t=$(now)
		pod "$name" "$rc" | k apply -f - >/dev/null
		if ! k wait --for=condition=Ready "pod/$name" --timeout=120s >/dev/null; then
			log "$name did not become Ready"
			k describe pod "$name" >&2 || true
			fail=1
			continue
		fi
		ready=$(since "$t")

		# A line both ways over the attach stream: kubectl's stdin is a fifo
		# held open until the echo comes back on its stdout.
		t=$(now)
		w=$(mktemp -d)
		mkfifo "$w/in"
		k attach -i -q "$name" -c c <"$w/in" >"$w/out" 2>&1 &
		apid=$!
		exec 3>"$w/in"
		echo "hello-$rt-$round" >&3
		got=""
		for _ in $(seq 1 200); do
			if grep -qx "echo: hello-$rt-$round" "$w/out"; then got="echo: hello-$rt-$round"; break; fi
			sleep 0.05
		done
		rtt=$(since "$t")
		# The network devices the container sees.
		echo net >&3
		net=""
		for _ in $(seq 1 200); do
			net=$(sed -n 's/^net: //p' "$w/out")
			[ -z "$net" ] || break
			sleep 0.05
		done
		if [ "$rt" = gvisor-nonet ] && [ "$net" != "lo " ]; then
			log "$name: sees network devices '$net', wants only lo"
			fail=1
		fi
		exec 3>&-
		kill "$apid" 2>/dev/null || true
		wait "$apid" 2>/dev/null || true
		if [ -z "$got" ]; then
			log "$name: no echo over kubectl attach; it printed: $(cat "$w/out")"
			fail=1
		fi
		rm -rf "$w"

		# Which runtime holds the container: the runc shim keeps runc's and
		# runsc's records under $DIR/run/<runtime>/k8s.io.
		id=$(k get pod "$name" -o jsonpath='{.status.containerStatuses[0].containerID}')
		id=${id#containerd://}
		if [ "$rt" = runc ]; then
			rt_bin=runc
			state=$("$RUNC" --root "$DIR/run/runc/k8s.io" state "$id" 2>&1 || true)
		else
			rt_bin=runsc
			state=$("$RUNSC" --root "$DIR/run/runsc/k8s.io" state "$id" 2>&1 || true)
		fi
		if ! grep -q '"status": "running"' <<<"$state"; then
			log "$name: container $id is not running under $rt_bin: $state"
			fail=1
			held="NOT under $rt_bin"
		else
			held="running under $rt_bin"
		fi

		t=$(now)
		k delete pod "$name" --wait=true >/dev/null
		del=$(since "$t")
		printf '%-12s round %d: Ready %s s, attach round trip %s s (%s), devices: %s, deleted %s s, %s\n' \
			"$rt" "$round" "$ready" "$rtt" "${got:-NO ECHO}" "${net:-?}" "$del" "$held"
	done
done
exit "$fail"
