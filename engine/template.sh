# The loader of a one-shot of a shell template (engine/template.go): run as
# `sh -c SOURCE /tmp/main.sh WORKDIR START READY`, it enters WORKDIR, runs
# START and READY in this shell with their output discarded (their
# variables and functions stay), and then runs the program with `.`, $0
# the program's path as in a cold `sh /tmp/main.sh`. A START or READY that
# fails ends it with status 125 and a line on stderr that starts
# "stockade: the template's ".
d=$1 s=$2 r=$3
shift 3
if [ -n "$d" ]; then
	cd "$d" 2>/dev/null || { echo "stockade: the template's workdir failed: cannot enter $d" >&2; exit 125; }
fi
if [ -n "$s" ]; then
	eval "$s" </dev/null >/dev/null 2>&1 || { echo "stockade: the template's start failed: exit status $?" >&2; exit 125; }
fi
if [ -n "$r" ]; then
	eval "$r" </dev/null >/dev/null 2>&1 || { echo "stockade: the template's ready failed: exit status $?" >&2; exit 125; }
fi
unset d s r
. "$0"
