#!/usr/bin/env bash
# Tears down what scripts/kube/up.sh brought up, and only that: the
# processes named by its PID files, the shims and containers they started
# (found through containerd's state under $STOCKADE_KUBE_DIR), mounts under
# that directory, the cgroups under the kubelet's cgroupRoot, the network
# namespace and its veth, then the directory itself. Safe to run twice or
# after a failed up.sh. Exits non-zero if anything of the cluster is left.
set -uo pipefail

CACHE=${STOCKADE_KUBE_CACHE:-/usr/local/lib/stockade}
KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
envfile=$CACHE/kube-cluster-$KUBE_VERSION.env
# shellcheck disable=SC1090
[ -r "$envfile" ] && . "$envfile"

NS=${STOCKADE_KUBE_NETNS:-stockade-kube}
DIR=${STOCKADE_KUBE_DIR:-/var/lib/stockade-kube}
CGROUP_ROOT=/stockade-kube
PIDS=$DIR/pids
RUN=$DIR/run
HOST_VETH=${NS:0:10}-h

log() { printf '%s down.sh: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

[ "$(id -u)" = 0 ] || { echo "down.sh: needs root" >&2; exit 1; }
t0=$(date +%s.%N)

# alive PID: the process exists and is not a zombie.
alive() { [ -e "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

# stop NAME [SECONDS]: TERM, then KILL after SECONDS (10), the process in
# $PIDS/NAME.pid.
stop() {
	local f=$PIDS/$1.pid pid i
	[ -s "$f" ] || return 0
	pid=$(cat "$f")
	if alive "$pid"; then
		kill -TERM "$pid" 2>/dev/null
		for i in $(seq 1 $((${2:-10} * 5))); do alive "$pid" || break; sleep 0.2; done
		if alive "$pid"; then
			log "$1 ($pid) still running after TERM; killing"
			kill -KILL "$pid" 2>/dev/null
			sleep 0.2
		fi
	fi
	rm -f "$f"
}

# Pods first, while the kubelet still runs: it stops their containers and
# the shims exit with their last task.
if [ -s "$PIDS/kubelet.pid" ] && [ -n "${KUBE_BIN:-}" ] && [ -r "$DIR/admin.kubeconfig" ]; then
	k() { timeout 60 "$KUBE_BIN/kubectl" --kubeconfig "$DIR/admin.kubeconfig" --request-timeout=10s "$@"; }
	if k get --raw /readyz >/dev/null 2>&1; then
		k delete pods --all --all-namespaces --grace-period=1 --wait=true --timeout=30s >/dev/null 2>&1 ||
			log "deleting pods did not finish; stopping them through containerd"
	fi
fi
stop kubelet

# Whatever is still running under containerd: kill and delete each task
# (CRI's sandboxes too), then stop containerd.
if [ -n "${CONTAINERD_BIN:-}" ] && [ -S "$RUN/containerd.sock" ]; then
	c() { timeout 20 "$CONTAINERD_BIN/ctr" --address "$RUN/containerd.sock" -n k8s.io "$@"; }
	for id in $(c tasks ls -q 2>/dev/null); do
		c tasks kill -s SIGKILL --all "$id" >/dev/null 2>&1
	done
	sleep 0.5
	for id in $(c tasks ls -q 2>/dev/null); do
		c tasks delete --force "$id" >/dev/null 2>&1
	done
fi
stop containerd

# A container or shim that outlived containerd (up.sh or containerd died
# early): each container's bundle under containerd's state directory, which
# only this cluster uses, has its init.pid; each shim was started with
# -address $RUN/containerd.sock.
bundles=$DIR/containerd/state/io.containerd.runtime.v2.task
for f in "$bundles"/*/*/init.pid; do
	[ -s "$f" ] || continue
	pid=$(cat "$f")
	if alive "$pid"; then
		log "killing leftover container $pid ($(dirname "$f" | xargs basename))"
		kill -KILL "$pid" 2>/dev/null
	fi
done
for p in /proc/[0-9]*; do
	# (No grep -q after a pipe: under pipefail its early exit can fail the
	# writer with SIGPIPE, and the match would read as none.)
	if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -F -- "-address $RUN/containerd.sock " >/dev/null; then
		pid=${p#/proc/}
		log "killing leftover shim $pid"
		# Its listening socket in /run/containerd/s, which a killed shim
		# leaves behind: found by the inodes of its socket descriptors.
		inodes=$(ls -l "$p/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\]$/\1/p' | tr '\n' ' ')
		socks=$(awk -v ino=" $inodes" '$8 ~ "^/run/containerd/s/" && index(ino, " " $7 " ") {print $8}' "$p/net/unix" 2>/dev/null | sort -u)
		kill -KILL "$pid" 2>/dev/null
		[ -z "$socks" ] || rm -f $socks
	fi
done
# A killed shim leaves its socket (named in its bundle's address file).
for f in "$bundles"/*/*/address; do
	[ -s "$f" ] || continue
	sock=$(sed 's#^unix://##' "$f")
	case $sock in /run/containerd/s/*) rm -f "$sock" ;; esac
done
# Pods' network namespaces, should one be outside the state directory.
for ns in $(cat "$bundles"/*/*/config.json 2>/dev/null | grep -o '"path":"/var/run/netns/[^"]*"' | sort -u | cut -d'"' -f4); do
	[ -e "$ns" ] || continue
	umount "$ns" 2>/dev/null
	rm -f "$ns"
done
# runc and runsc keep their own records of containers under $RUN (gVisor
# pods' pause containers are runc's, under runsc's root).
for rt in "${RUNC:-}:$RUN/runc/k8s.io" "${RUNC:-}:$RUN/runsc/k8s.io" "${RUNSC:-}:$RUN/runsc/k8s.io"; do
	bin=${rt%%:*} root=${rt#*:}
	[ -x "$bin" ] && [ -d "$root" ] || continue
	for id in $("$bin" --root "$root" list -q 2>/dev/null); do
		"$bin" --root "$root" delete --force "$id" >/dev/null 2>&1 ||
			log "$(basename "$bin") delete $id failed"
	done
done

for name in kube-scheduler kube-controller-manager kube-apiserver etcd registry; do
	stop "$name" 2
done

# Mounts under the cluster's directory (container rootfs, pod volumes,
# netns bind mounts), deepest first.
findmnt -rn -o TARGET | awk -v d="$DIR/" 'index($0, d) == 1' | sort -r | while read -r m; do
	umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
done

# The pods' cgroups: empty once their processes are gone; deepest first.
for h in /sys/fs/cgroup/*/; do
	d=$h${CGROUP_ROOT#/}
	[ -d "$d" ] || continue
	find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
	[ ! -d "$d" ] || log "cgroup $d is not empty"
done

# containerd keeps its shims' sockets in /run/containerd/s whatever its
# state directory; remove the directories if nothing else uses them.
rmdir /run/containerd/s /run/containerd/fifo /run/containerd 2>/dev/null

ip link del "$HOST_VETH" 2>/dev/null
ip netns del "$NS" 2>/dev/null

# What is left: any process whose command line or cwd names the directory
# (shims are started with -address $RUN/containerd.sock), the namespace,
# mounts, cgroups. The processes this script runs under (a caller whose
# command line names the directory, e.g. flock ... bash -c '... down.sh')
# are not left by the cluster.
ancestors=" "
a=$$
while [ "$a" -gt 1 ] 2>/dev/null; do
	ancestors+="$a "
	a=$(sed 's/.*) //' "/proc/$a/stat" 2>/dev/null | awk '{print $2}') || break
done
left=0
for p in /proc/[0-9]*; do
	pid=${p#/proc/}
	case $ancestors in *" $pid "*) continue ;; esac
	if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -F "$DIR/" >/dev/null; then
		log "still running: $pid $(tr '\0' ' ' <"$p/cmdline" | cut -c1-120)"
		left=1
	fi
done
if ip netns list | grep "^$NS\b" >/dev/null; then log "netns $NS is still there"; left=1; fi
if findmnt -rn -o TARGET | grep -F "$DIR/" >/dev/null; then log "mounts under $DIR remain"; left=1; fi
for h in /sys/fs/cgroup/*/; do
	if [ -d "$h${CGROUP_ROOT#/}" ]; then log "cgroup $h${CGROUP_ROOT#/} remains"; left=1; fi
done
if [ "$left" = 0 ]; then
	[ "${STOCKADE_KUBE_KEEP:-}" = 1 ] || rm -rf "$DIR"
	log "down in $(echo "$(date +%s.%N) $t0" | awk '{printf "%.1f", $1 - $2}') s; nothing left"
fi
exit "$left"
