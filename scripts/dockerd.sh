#!/usr/bin/env bash
# Starts and stops a private dockerd for Stockade's docker driver and its
# tests. Everything the daemon owns (data root, exec root, pidfile, socket,
# log, config) lives under DIR, so it never meets another dockerd on the
# host, nor /var/run/docker.sock.
#
#   scripts/dockerd.sh start DIR   # prints the DOCKER_HOST value, unix://DIR/docker.sock
#   scripts/dockerd.sh stop DIR    # stops exactly the dockerd started with DIR
#
# start installs Debian's docker.io when dockerd is missing (root only). The
# daemon gets no bridge and touches neither iptables nor the host's
# ip_forward sysctl: sandboxes run with --network=none.
set -euo pipefail

usage() {
	echo "usage: $0 start|stop DIR" >&2
	exit 2
}

[ $# -eq 2 ] || usage
cmd=$1
dir=$2
mkdir -p "$dir"
dir=$(cd "$dir" && pwd -P)
pidfile=$dir/docker.pid
sock=$dir/docker.sock

log() { echo "dockerd.sh: $*" >&2; }

running() {
	[ -s "$pidfile" ] || return 1
	local pid
	pid=$(cat "$pidfile")
	[ -d "/proc/$pid" ] || return 1
	# A stale pidfile may name a reused pid: check that it is our dockerd.
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--pidfile $pidfile"
}

answers() {
	curl -fsS --max-time 2 --unix-socket "$sock" http://docker/_ping >/dev/null 2>&1
}

install_docker() {
	command -v dockerd >/dev/null 2>&1 && return 0
	if [ "$(id -u)" != 0 ]; then
		log "dockerd is not installed and installing docker.io needs root"
		exit 1
	fi
	log "installing Debian's docker.io"
	# Keep the package from starting the system's docker and containerd
	# services: only the daemon below may run.
	local policy=/usr/sbin/policy-rc.d made_policy=""
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 0755 "$policy"
		made_policy=1
	fi
	local rc=0
	{
		apt-get update -qq &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io curl
	} >"$dir/apt.log" 2>&1 || rc=$?
	[ -z "$made_policy" ] || rm -f "$policy"
	if [ "$rc" != 0 ]; then
		tail -n 20 "$dir/apt.log" >&2
		log "installing docker.io failed (see $dir/apt.log)"
		exit 1
	fi
}

# kill_under ends what a killed daemon left running: its containerd and
# containerd shims, whose command lines name paths under DIR.
kill_under() {
	local p comm
	for p in /proc/[0-9]*; do
		comm=$(cat "$p/comm" 2>/dev/null) || continue
		case $comm in
		dockerd | containerd | containerd-shim*) ;;
		*) continue ;;
		esac
		if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "$dir/"; then
			kill -KILL "${p#/proc/}" 2>/dev/null || true
		fi
	done
}

# kill_containers ends the containers of a daemon that died without
# stopping them, through runc's state under the exec root.
kill_containers() {
	command -v runc >/dev/null 2>&1 || return 0
	local root id
	for root in "$dir"/exec/runtime-*/*; do
		[ -d "$root" ] || continue
		for id in $(runc --root "$root" list -q 2>/dev/null); do
			runc --root "$root" delete --force "$id" >/dev/null 2>&1 || true
		done
	done
}

# umount_under lazily unmounts whatever a killed daemon left mounted under
# DIR (overlay layers, shm, network namespaces), deepest first.
umount_under() {
	awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do
		umount -l "$m" 2>/dev/null || true
	done
}

start() {
	install_docker
	command -v curl >/dev/null 2>&1 || {
		log "curl is needed to check the daemon; apt-get install curl"
		exit 1
	}
	if running; then
		if answers; then
			echo "unix://$sock"
			return 0
		fi
		log "dockerd $(cat "$pidfile") runs but does not answer on $sock"
		exit 1
	fi
	# A unix socket path is limited to 108 bytes; containerd's lives deepest.
	if [ ${#dir} -gt 60 ]; then
		log "DIR $dir is too long for the daemon's sockets; use a shorter path"
		exit 1
	fi
	rm -f "$pidfile" "$sock"
	mkdir -p "$dir/data" "$dir/exec"
	# An empty config keeps /etc/docker/daemon.json out of it.
	echo '{}' >"$dir/daemon.json"
	# setsid: the daemon outlives this script and the caller's process group.
	setsid dockerd \
		--config-file "$dir/daemon.json" \
		--data-root "$dir/data" \
		--exec-root "$dir/exec" \
		--pidfile "$pidfile" \
		--host "unix://$sock" \
		--bridge=none \
		--iptables=false \
		--ip6tables=false \
		--ip-forward=false \
		--ip-masq=false \
		--userland-proxy=false \
		--log-level=warn \
		</dev/null >"$dir/dockerd.log" 2>&1 &
	local i
	for i in $(seq 1 300); do # 30 s
		if answers; then
			echo "unix://$sock"
			return 0
		fi
		if ! kill -0 $! 2>/dev/null; then
			tail -n 20 "$dir/dockerd.log" >&2
			log "dockerd exited during start (log: $dir/dockerd.log)"
			exit 1
		fi
		sleep 0.1
	done
	tail -n 20 "$dir/dockerd.log" >&2
	log "dockerd did not answer on $sock within 30 s (log: $dir/dockerd.log)"
	kill -TERM $! 2>/dev/null || true
	exit 1
}

# alive tells whether process $1 runs (a zombie does not).
alive() {
	local state
	state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
	[ -n "$state" ] && [ "$state" != Z ]
}

stop() {
	if running; then
		local pid i
		pid=$(cat "$pidfile")
		kill -TERM "$pid"
		for i in $(seq 1 200); do # 20 s: dockerd stops its containers first
			alive "$pid" || break
			sleep 0.1
		done
		if alive "$pid"; then
			log "dockerd $pid did not stop within 20 s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 0.5
		fi
	fi
	rm -f "$pidfile"
	# What a crashed or killed daemon leaves behind; nothing after a clean stop.
	kill_containers
	kill_under
	umount_under
}

case $cmd in
start) start ;;
stop) stop ;;
*) usage ;;
esac
