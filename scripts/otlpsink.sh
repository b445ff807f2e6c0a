#!/usr/bin/env bash
# Builds (once per version) the OTLP receiver the telemetry test sends its
# traces to (scripts/otlpsink: the OpenTelemetry Collector's otlpreceiver
# writing what it receives to a file) and prints the binary's path.
#
# The build comes from the Go module proxy, in its own module, so that the
# collector's dependencies never enter Stockade's go.mod, and lands in a
# directory named by the receiver's version under $STOCKADE_TOOLS_CACHE
# (default /usr/local/lib/stockade, where `stockade setup` keeps runsc),
# outside any checkout: a machine that keeps its files builds it once
# and later runs take no time. Measured on the 2-core machine, shared,
# nice 19: 36 s with Go's build cache warm from Stockade's own build,
# 2 min (75 s of CPU) with an empty one; the first download of its 75
# modules (about 100 MiB of zips, some of them Stockade's own) comes on
# top. The binary is moved into place only once built. The tests (api:
# TestTraceOfApprovedInvocation, TestTraceOfSessionCell) run this script
# themselves when STOCKADE_TEST_OTLPSINK is unset.
#
# Usage: scripts/otlpsink.sh      (prints the binary's path)
set -euo pipefail
cd "$(dirname "$0")/otlpsink"

export PATH=/usr/local/go/bin:$PATH
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

# The receiver's version: the otlpreceiver module go.mod requires.
VERSION=$(sed -n 's#^\s*go.opentelemetry.io/collector/receiver/otlpreceiver \(v[0-9.]*\)$#\1#p' go.mod)
[ -n "$VERSION" ] || { echo "otlpsink.sh: no otlpreceiver version in go.mod" >&2; exit 1; }
CACHE=${STOCKADE_TOOLS_CACHE:-/usr/local/lib/stockade}
# The sink's own source is part of the name: a changed main.go builds anew.
SUM=$(cat main.go go.mod go.sum | sha256sum | cut -c1-12)
dir=$CACHE/otlpsink-$VERSION-$SUM
bin=$dir/otlpsink

if [ ! -x "$bin" ]; then
	t0=$(date +%s)
	mkdir -p "$dir"
	# A build of its own: builds running at once (two test binaries)
	# each write their file, and the last rename wins. (A directory:
	# go build will not overwrite mktemp's empty file.)
	tmp=$(mktemp -d "$dir/build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	nice -n 10 go build -trimpath -ldflags '-s -w' -o "$tmp/otlpsink" .
	mv "$tmp/otlpsink" "$bin"
	rm -rf "$tmp"
	trap - EXIT
	echo "otlpsink.sh: built $bin in $(($(date +%s) - t0)) s" >&2
fi
echo "$bin"
