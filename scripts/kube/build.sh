#!/usr/bin/env bash
# Builds (once per version) and caches everything the test cluster needs
# (issue 33, "The test cluster"): Kubernetes' five node and control-plane
# commands, containerd with its runc shim and ctr, runsc, and a static pause
# image; installs Debian's etcd-server and containernetworking-plugins.
#
# Every build comes from the Go module proxy and lands in a directory named
# by its version under $STOCKADE_KUBE_CACHE (default /usr/local/lib/stockade,
# where `stockade setup` keeps runsc), outside any checkout, so a machine
# that keeps its files builds once and later runs take seconds. A binary is
# moved into place only once built, and the env file up.sh reads
# ($STOCKADE_KUBE_CACHE/kube-cluster-$KUBE_VERSION.env) is written last,
# only when every part is there: a run cut short leaves no stamp and the
# next run builds only what is missing.
#
# Usage: scripts/kube/build.sh      (prints the env file's path last)
# Needs root (apt-get, /usr/local/lib). Run it under `nice -n 19` on a
# shared machine; it does not renice itself.
set -euo pipefail
cd "$(dirname "$0")/../.."

export PATH=/usr/local/go/bin:$PATH
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
# The staging modules (k8s.io/api, k8s.io/client-go, ...) are published as
# v0.<minor>.<patch> of the same release.
STAGING_VERSION=v0.${KUBE_VERSION#v1.}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.1.9}
# The gVisor the project pins (driver/gvisor.Version), as `stockade setup`
# builds it.
GVISOR_VERSION=${GVISOR_VERSION:-$(sed -n 's/^const Version = "\(.*\)"$/\1/p' driver/gvisor/driver.go)}
CACHE=${STOCKADE_KUBE_CACHE:-/usr/local/lib/stockade}
# The name the pause image is imported under; containerd pins it as the
# sandbox image, so nothing is ever pulled.
PAUSE_IMAGE=stockade.invalid/pause:${KUBE_VERSION}

KUBE_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
CONTAINERD_BINS=(containerd containerd-shim-runc-v2 ctr)

kubedir=$CACHE/kube-$KUBE_VERSION
ctrddir=$CACHE/containerd-$CONTAINERD_VERSION
pausedir=$CACHE/pause-$KUBE_VERSION
runsc=$CACHE/runsc-$GVISOR_VERSION
envfile=$CACHE/kube-cluster-$KUBE_VERSION.env

[ -n "$GVISOR_VERSION" ] || { echo "build.sh: no gVisor version in driver/gvisor/driver.go" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "build.sh: needs root" >&2; exit 1; }

work=$(mktemp -d /tmp/stockade-kube-build.XXXXXX)
trap 'rm -rf "$work"' EXIT

log() { printf '%s build.sh: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# timed NAME CMD...: runs CMD and logs how long NAME took.
timed() {
	local name=$1 t0 t1
	shift
	t0=$(date +%s)
	"$@"
	t1=$(date +%s)
	log "$name: built in $((t1 - t0)) s"
}

# Debian's etcd (3.4) and the CNI plugins. The packages' init scripts must
# not start a host etcd: policy-rc.d refuses it for the install's duration
# (only if the machine has none of its own).
install_packages() {
	local missing=()
	[ -x /usr/bin/etcd ] || missing+=(etcd-server)
	[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] ||
		missing+=(containernetworking-plugins)
	command -v gcc >/dev/null && [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || missing+=(gcc libc6-dev)
	# up.sh makes certificates, the namespace and veth, and polls etcd.
	command -v openssl >/dev/null || missing+=(openssl)
	command -v ip >/dev/null || missing+=(iproute2)
	command -v curl >/dev/null || missing+=(curl)
	[ -x /usr/sbin/runc ] || missing+=(runc)
	# smoke.sh's pod image is one static busybox.
	dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
	if [ ${#missing[@]} = 0 ]; then
		log "etcd-server, containernetworking-plugins, busybox-static: present"
		return
	fi
	log "installing ${missing[*]} with apt-get"
	local made_policy=
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 0755 /usr/sbin/policy-rc.d
		made_policy=1
	fi
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
	[ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
}

# go_module DIR MODULE VERSION [REPLACES...]: a throwaway module in DIR that
# requires MODULE@VERSION, with "old => new version" replace lines.
go_module() {
	local dir=$1 mod=$2 ver=$3
	shift 3
	mkdir -p "$dir"
	{
		echo "module stockade.invalid/build"
		echo
		echo "go 1.24.0"
		echo
		echo "require $mod $ver"
		for r in "$@"; do echo "replace $r"; done
	} >"$dir/go.mod"
}

# tools_go DIR PKG...: a file importing each command's package, so that
# `go mod tidy` records every module they need.
tools_go() {
	local dir=$1
	shift
	{
		echo "//go:build tools"
		echo
		echo "package tools"
		echo
		echo "import ("
		for p in "$@"; do echo "	_ \"$p\""; done
		echo ")"
	} >"$dir/tools.go"
}

build_kube() {
	local need=() b
	for b in "${KUBE_BINS[@]}"; do [ -x "$kubedir/$b" ] || need+=("$b"); done
	if [ ${#need[@]} = 0 ]; then
		log "kubernetes $KUBE_VERSION: cached in $kubedir"
		return
	fi
	log "kubernetes $KUBE_VERSION: building ${need[*]}"
	local m=$work/kube
	# `go install k8s.io/kubernetes/cmd/...@v1.34.4` is refused: the
	# module's go.mod replaces its 31 staging modules with ./staging
	# paths. A module of our own requires it and replaces each staging
	# module with its published v0 release instead.
	local gomod
	gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
	local replaces=()
	while read -r s; do
		replaces+=("$s => $s $STAGING_VERSION")
	done < <(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$gomod")
	[ ${#replaces[@]} -gt 20 ] || { log "found only ${#replaces[@]} staging modules in $gomod"; exit 1; }
	log "replacing ${#replaces[@]} staging modules with $STAGING_VERSION"
	go_module "$m" k8s.io/kubernetes "$KUBE_VERSION" "${replaces[@]}"
	local pkgs=()
	for b in "${KUBE_BINS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
	tools_go "$m" "${pkgs[@]}"
	(cd "$m" && go mod tidy)
	# What Kubernetes' hack/lib/version.sh stamps, so each component
	# reports (and the kubelet registers as) the release it is.
	local ld="-s -w" p
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1"
		ld+=" -X $p.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
		ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	done
	mkdir -p "$kubedir"
	for b in "${need[@]}"; do
		timed "$b" bash -c 'cd "$1" && go build -trimpath -ldflags "$2" -o "$3.tmp" "k8s.io/kubernetes/cmd/$4"' _ \
			"$m" "$ld" "$kubedir/$b" "$b"
		mv "$kubedir/$b.tmp" "$kubedir/$b"
	done
}

build_containerd() {
	local need=() b
	for b in "${CONTAINERD_BINS[@]}"; do [ -x "$ctrddir/$b" ] || need+=("$b"); done
	if [ ${#need[@]} = 0 ]; then
		log "containerd $CONTAINERD_VERSION: cached in $ctrddir"
		return
	fi
	log "containerd $CONTAINERD_VERSION: building ${need[*]}"
	local m=$work/containerd mod=github.com/containerd/containerd/v2
	go_module "$m" "$mod" "$CONTAINERD_VERSION"
	local pkgs=()
	for b in "${CONTAINERD_BINS[@]}"; do pkgs+=("$mod/cmd/$b"); done
	tools_go "$m" "${pkgs[@]}"
	(cd "$m" && go mod tidy)
	# Static, without cgo: the btrfs and devmapper snapshotters need cgo
	# and the cluster uses overlayfs.
	local ld="-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Package=github.com/containerd/containerd"
	mkdir -p "$ctrddir"
	for b in "${need[@]}"; do
		timed "$b" bash -c 'cd "$1" && go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "$2" -o "$3.tmp" "$4"' _ \
			"$m" "$ld" "$ctrddir/$b" "$mod/cmd/$b"
		mv "$ctrddir/$b.tmp" "$ctrddir/$b"
	done
}

build_runsc() {
	if [ -x "$runsc" ]; then
		log "runsc $GVISOR_VERSION: cached in $runsc"
		return
	fi
	log "runsc $GVISOR_VERSION: building"
	timed runsc env GOBIN="$work/gobin" go install -trimpath -ldflags "-s -w" "gvisor.dev/gvisor/runsc@$GVISOR_VERSION"
	mkdir -p "$CACHE"
	mv "$work/gobin/runsc" "$runsc"
}

# The pause image: Kubernetes' pause.c (from the module just downloaded),
# compiled static, in a docker-archive tar that `ctr images import` names
# $PAUSE_IMAGE. A one-layer image of one file, built here rather than
# pulled: the cluster reaches no registry.
build_pause() {
	if [ -s "$pausedir/pause.tar" ]; then
		log "pause image: cached in $pausedir"
		return
	fi
	local src
	src=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')/build/pause/linux/pause.c
	local p=$work/pause
	mkdir -p "$p/rootfs" "$p/img"
	local tag
	tag=$(sed -n 's/^TAG ?= *//p' "$(dirname "$src")/../Makefile" 2>/dev/null || true)
	gcc -Os -Wall -Werror -static -DVERSION="${tag:-$KUBE_VERSION}" -o "$p/rootfs/pause" "$src"
	strip "$p/rootfs/pause"
	tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$p/rootfs" -cf "$p/img/layer.tar" pause
	local diff
	diff=$(sha256sum "$p/img/layer.tar" | cut -d' ' -f1)
	cat >"$p/img/config.json" <<EOF
{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:$diff"]}}
EOF
	cat >"$p/img/manifest.json" <<EOF
[{"Config":"config.json","RepoTags":["$PAUSE_IMAGE"],"Layers":["layer.tar"]}]
EOF
	mkdir -p "$pausedir"
	tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$p/img" -cf "$pausedir/pause.tar.tmp" manifest.json config.json layer.tar
	mv "$pausedir/pause.tar.tmp" "$pausedir/pause.tar"
	log "pause image: $pausedir/pause.tar ($PAUSE_IMAGE, pause.c tag ${tag:-unknown})"
}

t0=$(date +%s)
install_packages
parts=${*:-packages pause containerd runsc kube}
for part in $parts; do
	case $part in
	packages) ;;
	kube) build_kube ;;
	containerd) build_containerd ;;
	runsc) build_runsc ;;
	pause) build_pause ;;
	*) echo "build.sh: unknown part $part" >&2; exit 2 ;;
	esac
done

for f in "${KUBE_BINS[@]/#/$kubedir/}" "${CONTAINERD_BINS[@]/#/$ctrddir/}" "$runsc" "$pausedir/pause.tar" /usr/bin/etcd /usr/lib/cni/bridge; do
	if [ ! -e "$f" ]; then
		log "not complete yet: $f is missing (no stamp written)"
		exit 0
	fi
done
cat >"$envfile.tmp" <<EOF
# Written by scripts/kube/build.sh when every part below was in place.
KUBE_VERSION=$KUBE_VERSION
KUBE_BIN=$kubedir
CONTAINERD_VERSION=$CONTAINERD_VERSION
CONTAINERD_BIN=$ctrddir
GVISOR_VERSION=$GVISOR_VERSION
RUNSC=$runsc
RUNC=/usr/sbin/runc
PAUSE_TAR=$pausedir/pause.tar
PAUSE_IMAGE=$PAUSE_IMAGE
ETCD=/usr/bin/etcd
CNI_BIN=/usr/lib/cni
EOF
mv "$envfile.tmp" "$envfile"
log "complete in $(($(date +%s) - t0)) s"
echo "$envfile"
