#!/usr/bin/env bash
# Brings up the test cluster (issue 33): a real single-node Kubernetes
# inside a network namespace this script creates, from what build.sh
# cached. Prints the kubeconfig's path last.
#
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#   containerd and kubelet run in netns $STOCKADE_KUBE_NETNS (default
#   stockade-kube), in the host's mount namespace (nsenter --net, not
#   `ip netns exec`, which would give each its own mount namespace and hide
#   the kubelet's volume mounts from containerd). A veth pair joins the
#   host ($PREFIX.1) to the node ($PREFIX.2, the apiserver's and kubelet's
#   address), so kubectl and a driver on the host reach the apiserver. The
#   namespace has no default route, and the host no route to the pods.
#   Pods get 10.88.0.0/16 from the bridge and host-local CNI plugins.
#
# Everything the cluster writes (certificates, etcd, containerd's root and
# state, the kubelet's root, pod logs, CNI leases) is under
# $STOCKADE_KUBE_DIR (default /var/lib/stockade-kube); each process's PID
# is in $STOCKADE_KUBE_DIR/pids for down.sh, which undoes all of it.
#
# Runtimes: runc (the default), RuntimeClass `runc-nonet` (runc, pods
# without a network: see nonet below) and RuntimeClasses `gvisor` and
# `gvisor-nonet` (runsc --network=none, also without a network) whose
# handlers run runsc with --oci-seccomp (so that the pod's seccomp
# profile is applied inside the sandbox too) through containerd's runc
# shim (BinaryName): the gVisor shim sets its own oom_score_adj, which
# fails without CAP_SYS_RESOURCE.
#
# Images: the driver's images are imported on the node (the tests'
# importImage) or pulled by digest from a registry (kubernetes.registry,
# `stockade image push`): Debian's docker-registry, when installed, runs
# on the host side of the veth, $PREFIX.1:$STOCKADE_KUBE_REGISTRY_PORT
# (default 5000; its store under $STOCKADE_KUBE_DIR), and containerd
# pulls from it over plain http (a hosts.toml under certs.d).
#
# Every pod of the node runs under a pids limit, the kubelet's
# podPidsLimit ($STOCKADE_KUBE_POD_PIDS_LIMIT, default 64, the conformance
# suite's limit): Kubernetes has no pids limit per pod, only this one per
# node, which the operator of a cluster for Stockade must set. It counts a
# gVisor pod's Sentry threads too (the driver holds the program to its
# limit with RLIMIT_NPROC there), so a node of gVisor pods needs the
# program's limit plus 256 (320 for the suite's gVisor run).
set -euo pipefail

CACHE=${STOCKADE_KUBE_CACHE:-/usr/local/lib/stockade}
KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
envfile=$CACHE/kube-cluster-$KUBE_VERSION.env
[ -r "$envfile" ] || { echo "up.sh: $envfile missing; run scripts/kube/build.sh first" >&2; exit 1; }
# shellcheck disable=SC1090
. "$envfile"

NS=${STOCKADE_KUBE_NETNS:-stockade-kube}
DIR=${STOCKADE_KUBE_DIR:-/var/lib/stockade-kube}
PREFIX=${STOCKADE_KUBE_PREFIX:-10.250.250}
HOST_IP=$PREFIX.1
NODE_IP=$PREFIX.2
NODE=${STOCKADE_KUBE_NODE:-stockade-kube}
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
# cgroup v1 parent of every pod's cgroup (the kubelet's cgroupRoot), so
# down.sh can remove exactly the cgroups the cluster made.
CGROUP_ROOT=/stockade-kube
TIMEOUT=${STOCKADE_KUBE_TIMEOUT:-120}
POD_PIDS_LIMIT=${STOCKADE_KUBE_POD_PIDS_LIMIT:-64}
REGISTRY=$HOST_IP:${STOCKADE_KUBE_REGISTRY_PORT:-5000}

PKI=$DIR/pki
RUN=$DIR/run
LOGS=$DIR/logs
PIDS=$DIR/pids
KUBECONFIG_ADMIN=$DIR/admin.kubeconfig
KUBECTL=$KUBE_BIN/kubectl
HOST_VETH=${NS:0:10}-h

log() { printf '%s up.sh: %s\n' "$(date -u +%H:%M:%S.%N | cut -c1-12)" "$*" >&2; }
now() { date +%s.%N; }
since() { echo "$(now) $1" | awk '{printf "%.1f", $1 - $2}'; }
die() {
	log "$*"
	log "logs in $LOGS; run scripts/kube/down.sh to clean up"
	exit 1
}

[ "$(id -u)" = 0 ] || { echo "up.sh: needs root" >&2; exit 1; }
if [ -e "$PIDS" ] || ip netns list | grep -x "$NS\( .*\)\?" >/dev/null; then
	echo "up.sh: a cluster is already up ($PIDS or netns $NS exists); run scripts/kube/down.sh" >&2
	exit 1
fi

t0=$(now)
trap 'log "failed at line $LINENO; logs in $LOGS; run scripts/kube/down.sh to clean up"' ERR
umask 077
mkdir -p "$PKI" "$RUN" "$LOGS" "$PIDS" "$DIR/etcd" "$DIR/cni/net.d" "$DIR/cni/ipam" \
	"$DIR/cni/nonet.d" "$DIR/cni/bin"

# --- network namespace -------------------------------------------------------
ip netns add "$NS"
ip -n "$NS" link set lo up
ip link add "$HOST_VETH" type veth peer name eth0 netns "$NS"
ip addr add "$HOST_IP/30" dev "$HOST_VETH"
ip link set "$HOST_VETH" up
ip -n "$NS" addr add "$NODE_IP/30" dev eth0
ip -n "$NS" link set eth0 up
log "netns $NS: node $NODE_IP, host side $HOST_VETH $HOST_IP"

# start NAME CMD...: runs CMD in the namespace, detached from this script's
# session, logging to $LOGS/NAME.log; its PID (nsenter execs CMD, setsid
# execs nsenter) goes to $PIDS/NAME.pid.
start() {
	local name=$1
	shift
	setsid nsenter --net="/run/netns/$NS" -- "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$PIDS/$name.pid"
}

# wait_for WHAT CMD...: polls CMD until it succeeds, within $TIMEOUT s.
wait_for() {
	local what=$1 deadline
	shift
	deadline=$(($(date +%s) + TIMEOUT))
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$deadline" ] || die "timed out waiting for $what"
		sleep 0.2
	done
}

# --- certificates and tokens ---------------------------------------------------
# One CA signs the apiserver's serving certificate and the client
# certificate it shows the kubelet; clients authenticate with static tokens.
# Keys are root's only (umask 077).
ossl() { openssl "$@" 2>>"$LOGS/openssl.log"; }
ossl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=stockade-kube-ca" \
	-keyout "$PKI/ca.key" -out "$PKI/ca.crt"
cat >"$PKI/apiserver.ext" <<EOF
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local, DNS:localhost, IP:$NODE_IP, IP:$SERVICE_IP, IP:127.0.0.1
EOF
cat >"$PKI/client.ext" <<EOF
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
EOF
# cert NAME SUBJECT EXTFILE
cert() {
	ossl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$PKI/$1.key" -out "$PKI/$1.csr"
	ossl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 30 -extfile "$3" -out "$PKI/$1.crt"
}
cert apiserver "/CN=kube-apiserver" "$PKI/apiserver.ext"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$PKI/client.ext"
ossl genrsa -out "$PKI/sa.key" 2048
ossl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"

token() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
ADMIN_TOKEN=$(token)
CM_TOKEN=$(token)
SCHED_TOKEN=$(token)
KUBELET_TOKEN=$(token)
cat >"$PKI/tokens.csv" <<EOF
$ADMIN_TOKEN,stockade-kube-admin,uid-admin,"system:masters"
$CM_TOKEN,system:kube-controller-manager,uid-cm
$SCHED_TOKEN,system:kube-scheduler,uid-sched
$KUBELET_TOKEN,system:node:$NODE,uid-node,"system:nodes"
EOF

# kubeconfig FILE TOKEN
kubeconfig() {
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: stockade-kube
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority: $PKI/ca.crt
users:
- name: user
  user:
    token: $2
contexts:
- name: stockade-kube
  context: {cluster: stockade-kube, user: user}
current-context: stockade-kube
EOF
}
kubeconfig "$KUBECONFIG_ADMIN" "$ADMIN_TOKEN"
kubeconfig "$DIR/controller-manager.kubeconfig" "$CM_TOKEN"
kubeconfig "$DIR/scheduler.kubeconfig" "$SCHED_TOKEN"
kubeconfig "$DIR/kubelet.kubeconfig" "$KUBELET_TOKEN"
k() { "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
# What the daemons make for pods (their /etc/hosts, resolv.conf, volume
# files) must stay readable to a non-root container user.
umask 022

# --- control plane ---------------------------------------------------------------
start etcd "$ETCD" --name stockade-kube --data-dir "$DIR/etcd" \
	--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
	--initial-cluster stockade-kube=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
wait_for etcd nsenter --net="/run/netns/$NS" curl -sf http://127.0.0.1:2381/health
log "etcd up ($(since "$t0") s)"

start kube-apiserver "$KUBE_BIN/kube-apiserver" \
	--advertise-address="$NODE_IP" --bind-address=0.0.0.0 --secure-port=6443 \
	--etcd-servers=http://127.0.0.1:2379 \
	--tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
	--client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
	--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
	--allow-privileged=false --anonymous-auth=false \
	--service-cluster-ip-range="$SERVICE_CIDR" \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
	--kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
	--kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
	--kubelet-preferred-address-types=InternalIP
wait_for kube-apiserver k get --raw /readyz
log "kube-apiserver ready ($(since "$t0") s)"

start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
	--kubeconfig="$DIR/controller-manager.kubeconfig" \
	--authentication-kubeconfig="$DIR/controller-manager.kubeconfig" \
	--authorization-kubeconfig="$DIR/controller-manager.kubeconfig" \
	--bind-address=127.0.0.1 --leader-elect=false \
	--use-service-account-credentials=true \
	--service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt"
start kube-scheduler "$KUBE_BIN/kube-scheduler" \
	--kubeconfig="$DIR/scheduler.kubeconfig" \
	--authentication-kubeconfig="$DIR/scheduler.kubeconfig" \
	--authorization-kubeconfig="$DIR/scheduler.kubeconfig" \
	--bind-address=127.0.0.1 --leader-elect=false

# --- node: containerd, CNI, kubelet --------------------------------------------------
cat >"$DIR/cni/net.d/10-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "stockade-kube",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DIR/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF

# nonet: the network of the *-nonet handlers' pods (containerd's cni_conf_dir
# per runtime). containerd sets up the pod's loopback itself and wants an
# eth0 with an address from the network's plugin, so this plugin reports
# one, from 192.0.2.0/24 (TEST-NET-1: no network of this machine's), and
# creates nothing: the pod's network namespace holds loopback only, and
# nothing outside it, the API server, the kubelet, cluster DNS or another
# pod, can be reached from it whatever network policies are (not)
# enforced. The address's last byte is random: duplicates are harmless
# to the kubelet, which only reports it.
cat >"$DIR/cni/bin/stockade-nonet" <<'EOF'
#!/bin/sh
# A CNI plugin giving a pod no network: see scripts/kube/up.sh.
case $CNI_COMMAND in
ADD)
	cat >/dev/null
	n=$(($(od -An -N2 -tu2 /dev/urandom) % 254 + 1))
	printf '{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"%s"}],"ips":[{"address":"192.0.2.%s/32","interface":0}]}\n' "$CNI_NETNS" "$n"
	;;
VERSION) printf '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}\n' ;;
*) cat >/dev/null ;;
esac
EOF
chmod 0755 "$DIR/cni/bin/stockade-nonet"
cat >"$DIR/cni/nonet.d/10-nonet.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "stockade-nonet", "plugins": [{"type": "stockade-nonet"}]}
EOF

cat >"$DIR/containerd.toml" <<EOF
version = 3
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
# opt would make /opt/containerd; NRI listens on /var/run/nri.
disabled_plugins = ["io.containerd.internal.v1.opt"]

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[grpc]
  address = "$RUN/containerd.sock"

[ttrpc]
  address = "$RUN/containerd.sock.ttrpc"

[debug]
  address = "$RUN/containerd-debug.sock"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = "$DIR/certs.d"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "$PAUSE_IMAGE"

[plugins.'io.containerd.cri.v1.runtime']
  # This machine's bounding set lacks CAP_SYS_RESOURCE: a container may
  # not be given a lower oom_score_adj than containerd's own.
  restrict_oom_score_adj = true
  # Pods' network namespaces under the state directory, not /run/netns.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["$CNI_BIN", "$DIR/cni/bin"]
  conf_dir = "$DIR/cni/net.d"

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "$RUNC"
  Root = "$RUN/runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc-nonet]
  runtime_type = "io.containerd.runc.v2"
  cni_conf_dir = "$DIR/cni/nonet.d"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc-nonet.options]
  BinaryName = "$RUNC"
  Root = "$RUN/runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
  BinaryName = "$DIR/runsc"
  Root = "$RUN/runsc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc-nonet]
  runtime_type = "io.containerd.runc.v2"
  cni_conf_dir = "$DIR/cni/nonet.d"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc-nonet.options]
  BinaryName = "$DIR/runsc-nonet"
  Root = "$RUN/runsc"
EOF
# runsc under the runc shim. The shim calls BinaryName with runc's global
# flags (--root, --log, --log-format), which runsc shares. Given the CRI's
# annotations, runsc would run a pod's containers in one sandbox, the pause
# container's, and start each one with the stdio of `runsc start` (none:
# the runc shim hands stdio only to create) and the shim would never see
# it exit. So this wrapper runs the pause container with runc (it holds
# the pod's namespaces; a gVisor pause would hold them in a network
# namespace of its own, empty) and renames those annotations in the
# workload's bundle at create, so that the workload is a gVisor sandbox of
# its own in the pod's network namespace, as under docker. A gVisor pod
# has one workload container. Every later call goes to the binary that
# created the container: runc keeps a directory with state.json per
# container under --root, runsc files. And when the shim kills what has
# already exited, runsc says "sandbox is not running" where runc says
# "container not running", the words the shim takes for "already
# finished": the wrapper translates, or a pod's deletion never completes.
# runsc_wrapper FILE FLAGS: the wrapper, FLAGS going before runsc's
# subcommand. Handler runsc takes --oci-seccomp and
# $STOCKADE_KUBE_RUNSC_FLAGS; handler runsc-nonet adds --network=none: its
# pods' sandboxes have no network device but loopback (and their pods'
# network namespaces none either: nonet above).
runsc_wrapper() {
	cat >"$1" <<EOF
#!/bin/sh
set -e
flags="$2"
bundle= prev= create= kill= root=
for a in "\$@"; do
	case \$prev in --bundle | -b) bundle=\$a ;; --root) root=\$a ;; esac
	case \$a in --bundle=*) bundle=\${a#--bundle=} ;; --root=*) root=\${a#--root=} ;; create) create=1 ;; kill) kill=1 ;; esac
	prev=\$a
done
if [ -n "\$create" ] && [ -f "\$bundle/config.json" ]; then
	if grep -q '"io.kubernetes.cri.container-type": *"sandbox"' "\$bundle/config.json"; then
		exec "$RUNC" "\$@"
	fi
	sed -i -e 's/"io\.kubernetes\.cri\.container-type"/"stockade.invalid\/cri.container-type"/' \\
		-e 's/"io\.kubernetes\.cri\.sandbox-id"/"stockade.invalid\/cri.sandbox-id"/' "\$bundle/config.json"
elif [ -n "\$root" ]; then
	for a in "\$@"; do
		case \$a in */* | "") continue ;; esac
		if [ -f "\$root/\$a/state.json" ]; then exec "$RUNC" "\$@"; fi
	done
fi
if [ -n "\$kill" ]; then
	if out=\$("$RUNSC" \$flags "\$@" 2>&1); then
		[ -z "\$out" ] || printf '%s\\n' "\$out"
		exit 0
	fi
	case \$out in *"is not running"*) echo "container not running" >&2 ;; *) printf '%s\\n' "\$out" >&2 ;; esac
	exit 1
fi
exec "$RUNSC" \$flags "\$@"
EOF
	chmod 0700 "$1"
}
runsc_wrapper "$DIR/runsc" "--oci-seccomp ${STOCKADE_KUBE_RUNSC_FLAGS:-}"
runsc_wrapper "$DIR/runsc-nonet" "--oci-seccomp ${STOCKADE_KUBE_RUNSC_FLAGS:-} --network=none"

# The registry on the host side, plain http (a test network of two
# addresses), and containerd's configuration of it.
mkdir -p "$DIR/certs.d/$REGISTRY"
cat >"$DIR/certs.d/$REGISTRY/hosts.toml" <<EOF
server = "http://$REGISTRY"

[host."http://$REGISTRY"]
  capabilities = ["pull", "resolve"]
EOF
if command -v docker-registry >/dev/null 2>&1; then
	mkdir -p "$DIR/registry"
	cat >"$DIR/registry/config.yml" <<EOF
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $DIR/registry/store}
http:
  addr: $REGISTRY
EOF
	setsid docker-registry serve "$DIR/registry/config.yml" >"$LOGS/registry.log" 2>&1 </dev/null &
	registry_pid=$!
	echo "$registry_pid" >"$PIDS/registry.pid"
	# Ours answers, not another on the port (Debian's docker-registry
	# service listens on :5000 of every address): it is alive once /v2/
	# answers, and it is what listens there.
	registry_dead() {
		die "the registry (pid $registry_pid) exited (is something else on $REGISTRY?): $(tail -n 3 "$LOGS/registry.log" | tr '\n' ' ')"
	}
	deadline=$(($(date +%s) + TIMEOUT))
	until curl -sf "http://$REGISTRY/v2/" >/dev/null 2>&1; do
		kill -0 "$registry_pid" 2>/dev/null || registry_dead
		[ "$(date +%s)" -lt "$deadline" ] || die "timed out waiting for the registry"
		sleep 0.2
	done
	sleep 0.5
	kill -0 "$registry_pid" 2>/dev/null || registry_dead
	listeners=$(ss -Hltnp "sport = :${REGISTRY##*:}")
	grep -q "pid=$registry_pid," <<<"$listeners" ||
		die "$REGISTRY is not served by our registry (pid $registry_pid): $listeners"
	log "registry up on $REGISTRY ($(since "$t0") s)"
fi

# Its shims are found on PATH: ours, not another containerd's.
start containerd env PATH="$CONTAINERD_BIN:$PATH" "$CONTAINERD_BIN/containerd" --config "$DIR/containerd.toml"
ctr() { "$CONTAINERD_BIN/ctr" --address "$RUN/containerd.sock" "$@"; }
wait_for containerd ctr version
ctr -n k8s.io images import "$PAUSE_TAR" >>"$LOGS/ctr.log"
log "containerd up, $PAUSE_IMAGE imported ($(since "$t0") s)"

# The kubelet's pods live under one cgroup v1 parent in every hierarchy.
for h in /sys/fs/cgroup/*/; do
	[ -e "$h/cgroup.procs" ] && [ ! -e "$h/cgroup.controllers" ] || continue
	mkdir -p "$h${CGROUP_ROOT#/}"
	if [ -e "$h/cpuset.cpus" ]; then
		cat "$h/cpuset.cpus" >"$h${CGROUP_ROOT#/}/cpuset.cpus"
		cat "$h/cpuset.mems" >"$h${CGROUP_ROOT#/}/cpuset.mems"
	fi
done

cat >"$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$RUN/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
address: $NODE_IP
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
podLogsDir: $DIR/pod-logs
registerNode: true
resolvConf: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
protectKernelDefaults: false
makeIPTablesUtilChains: false
localStorageCapacityIsolation: false
podPidsLimit: $POD_PIDS_LIMIT
EOF
# The kubelet sets six kernel sysctls for the whole machine when they
# differ from what it wants (vm.overcommit_memory=1, kernel.panic=10,
# kernel.panic_on_oops=1, ...; protectKernelDefaults only turns that into
# a refusal to start). This machine is shared, so the kubelet runs in a
# mount namespace of its own where those /proc/sys files are bind-mounted
# copies holding its values, and the host's stay as they are. Its root
# directory is a shared mount made first, so the volumes it mounts there
# propagate back to the host's namespace, where containerd sees them.
mkdir -p "$DIR/kubelet" "$DIR/sysctl"
mount --bind "$DIR/kubelet" "$DIR/kubelet"
mount --make-rshared "$DIR/kubelet"
binds=""
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
	kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
	f=${kv%=*} v=${kv#*=}
	[ "$(cat "/proc/sys/$f")" != "$v" ] || continue
	echo "$v" >"$DIR/sysctl/${f//\//.}"
	binds+="mount --bind $DIR/sysctl/${f//\//.} /proc/sys/$f && "
done
start kubelet unshare --mount --propagation unchanged -- \
	sh -c "mount --make-rprivate /proc && ${binds}exec \"\$0\" \"\$@\"" \
	"$KUBE_BIN/kubelet" --config="$DIR/kubelet.yaml" \
	--kubeconfig="$DIR/kubelet.kubeconfig" --root-dir="$DIR/kubelet" \
	--cert-dir="$PKI/kubelet" --hostname-override="$NODE" --node-ip="$NODE_IP"

node_ready() {
	[ "$(k get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
wait_for "node $NODE Ready" node_ready
log "node $NODE Ready ($(since "$t0") s)"

k apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor
handler: runsc
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor-nonet
handler: runsc-nonet
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: runc-nonet
handler: runc-nonet
EOF
# Pods are admitted only once their namespace's default ServiceAccount is.
wait_for "the default ServiceAccount" k -n default get serviceaccount default
log "RuntimeClasses gvisor, gvisor-nonet and runc-nonet created; cluster up in $(since "$t0") s"
echo "$KUBECONFIG_ADMIN"
