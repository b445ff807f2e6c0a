# The interpreter of a warm pool's python sandbox (engine/pool.go): started
# as `python3 -c SOURCE` when the pool fills, it imports numpy and pandas and
# then waits on its stdin for one program, which it runs as a cold
# `python3 /tmp/main.py` would: as __main__, with __file__, sys.argv and
# sys.path[0] of the file, the file itself written where the cold run's is,
# the rest of stdin as the program's stdin, and the exit status Python gives
# an uncaught exception, a SystemExit or a normal end. It runs once and the
# sandbox is destroyed after it. With an argument (engine/template.go's
# loaderConfig) it imports the modules that names instead, and runs a
# template's Start and Ready first, in the program's namespace: a cold
# one-shot of a template runs through it too.
#
# Stdin carries: the header's length in 8 decimal digits and a newline (one
# read, where each system call costs tens of microseconds in a gVisor
# sandbox that idled); the header, JSON
# {"path", "argv", "size"} (and "reseed": false, from a test only: see
# _reseed); size bytes of code; then the program's stdin. In a sandbox
# restored from a checkpoint, a header {"warm": true} (no code) comes
# first, as soon as it is restored: see _warm.
# Everything is read with os.read, so that nothing of the program's stdin is
# buffered by this loader: sys.stdin (not read here) and any child process
# see all of it.
#
# Descriptor 3, where the guest gives one (its exit notice, see
# guest.ExecRequest.ExitNotice), is moved out of the program's way at once
# (to a close-on-exec descriptor, so that 3 is the program's first open as
# in a cold run), and closed in the children the program forks: at the
# end, in this process only and if the descriptor is still the notice's,
# the status is written there and this process stops itself, and the
# guest reports the run without waiting for the kernel to tear down
# numpy's and pandas' memory.

import atexit
import builtins
import importlib.machinery
import json
import os
import signal
import sys
import warnings

try:
    _notice = os.dup(3)
    os.close(3)
    _notice_id = os.fstat(_notice)
except OSError:
    _notice = None
_pid = os.getpid()


def _drop_notice():
    # A child the program forks is not the run: it must not give its end.
    global _notice
    if _notice is not None:
        try:
            os.close(_notice)
        except OSError:
            pass
        _notice = None


os.register_at_fork(after_in_child=_drop_notice)

# The program's module, made now so that a template's Start fills the
# namespace the program runs in.
_main = type(sys)("__main__")
_main.__dict__.update({"__annotations__": {}, "__builtins__": builtins})

# argv[1], when given, is the engine's loaderConfig: the modules to import
# (numpy and pandas without it), and a template's working directory, Start
# and Ready, run before the program is read, their output discarded. A
# Start or Ready that fails ends the loader with status 125 and a line on
# stderr that starts "stockade: the template's " (engine/template.go).
_cfg = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {"preimport": ["numpy", "pandas"]}
del sys.argv[1:]


def _prepare(cfg):
    with warnings.catch_warnings():
        # Nothing may be written before the program runs: its output is
        # all the run's.
        warnings.simplefilter("ignore")
        for m in cfg.get("preimport") or []:
            __import__(m)
    if cfg.get("workdir"):
        os.chdir(cfg["workdir"])
    if not cfg.get("start") and not cfg.get("ready"):
        return
    sys.modules["__main__"] = _main
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    what, failed = None, None
    try:
        for what in ("start", "ready"):
            if cfg.get(what):
                exec(compile(cfg[what], "<template " + what + ">", "exec"), _main.__dict__)
    except BaseException as e:
        failed = "%s: %s" % (type(e).__name__, e)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    if failed is not None:
        line = "stockade: the template's %s failed: %s\n" % (what, failed.replace("\n", " ")[:400])
        os.write(2, line.encode("utf-8", "replace"))
        os._exit(125)


_prepare(_cfg)
del _cfg


def _read(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            os._exit(125)
        buf += chunk
    return bytes(buf)


def _header():
    digits = _read(9)
    if digits[8:] != b"\n" or not digits[:8].isdigit():
        os._exit(125)
    return json.loads(_read(int(digits[:8])))


def _reseed():
    # The sandbox may be a restore of a checkpoint taken while this loader
    # waited for its header (engine/poolsnap.go): every restore would draw the
    # random numbers the checkpoint's generators hold. Seeded again here,
    # once the program has come, from the kernel's random source (which a
    # restored sandbox draws from the host afresh), as a cold start seeds
    # them; in a sandbox started cold it changes nothing one could see.
    if "random" in sys.modules:
        sys.modules["random"].seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "tempfile" in sys.modules:
        sys.modules["tempfile"]._name_sequence = None


def _warm():
    # A restored sandbox (engine/poolsnap_exec.go) holds this process's
    # memory, but none of it is mapped into the process yet: gVisor maps
    # a page in at its first touch, a fault each (tens of microseconds),
    # which would slow the program's first milliseconds by more than the
    # run itself takes. So the path of a run is taken now, while the
    # sandbox waits, and goes nowhere: a program printing one line, its
    # stdout and stderr sent to /dev/null, in a namespace thrown away,
    # with the reseed. It writes no file: the sandbox is in its pool
    # while it warms, and an unbound pool sandbox's /tmp holds its empty
    # program file alone (TestPoolNoBleed looks). Touching every page
    # instead costs more CPU than the refill. Nothing is written to the
    # run's output; the reseed before the program draws afresh anyway.
    # A warm-up that fails costs only the speed it was for: whatever it
    # did, the program's stdout and stderr are restored.
    saved = os.dup(1), os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        _reseed()
        exec(compile("print(1)\n", "<warm>", "exec"), {"__name__": "__warm__", "__builtins__": builtins})
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


# A header {"warm": true} (the engine's, after a restore: see _warm) comes
# before the program's.
while True:
    _h = _header()
    if not _h.get("warm"):
        break
    _warm()
del _warm


if _h.get("reseed", True):  # false only in a test that looks at the checkpoint's state
    _reseed()
del _reseed
_path = _h["path"]
_code = _read(_h["size"])
# The guest created the file (empty) when the exec started, with the cold
# run's owner and mode: write the program into it, with plain system calls
# (open() would add an fstat, an ioctl and an lseek).
_fd = os.open(_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
_view = memoryview(_code)
while _view:
    _view = _view[os.write(_fd, _view) :]
os.close(_fd)

sys.argv = list(_h["argv"])
sys.orig_argv = ["/usr/bin/python3"] + sys.argv
sys.path[0] = os.path.dirname(_path)
_main.__dict__.update(
    {
        "__file__": _path,
        "__cached__": None,
        "__loader__": importlib.machinery.SourceFileLoader("__main__", _path),
    }
)
sys.modules["__main__"] = _main
del _h, _fd, _view


def _run(code, path, g):
    try:
        c = compile(code, path, "exec")
    except SyntaxError as e:
        # A cold run prints a syntax error without a traceback.
        sys.excepthook(type(e), e.with_traceback(None), None)
        return 1
    try:
        exec(c, g)
    except SystemExit:
        # Python ends it as it ends it in a cold run.
        raise
    except KeyboardInterrupt as e:
        # A cold run prints it, runs the exit functions and ends by SIGINT.
        tb = e.__traceback__.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 1
    except BaseException as e:
        # The traceback starts at the program's frame, without this
        # loader's, as a cold run's does.
        tb = e.__traceback__.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        return 1
    return 0


# The end of a cold run, without what costs a pool interpreter tens of
# milliseconds more and shows nothing: the teardown of the modules that
# numpy and pandas loaded. Non-daemon threads are joined, the exit
# functions run and stdio is flushed as Python's own exit does them; a
# flush that fails takes Python's whole exit, so that its report and
# status are a cold run's.
try:
    _status = _run(_code, _path, _main.__dict__)
except SystemExit as e:
    _status = e.code
    if _status is None:
        _status = 0
    elif not isinstance(_status, int):
        print(_status, file=sys.stderr)
        _status = 1
if "threading" in sys.modules:
    sys.modules["threading"]._shutdown()
atexit._run_exitfuncs()
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    sys.exit(_status)
if _notice is not None and os.getpid() == _pid:
    try:
        # Only to the notice's pipe: a program that closed its descriptors
        # may have opened another file under the same number.
        st = os.fstat(_notice)
        if (st.st_dev, st.st_ino) == (_notice_id.st_dev, _notice_id.st_ino):
            os.write(_notice, b"%d\n" % (_status & 0xFF))
            os.kill(_pid, signal.SIGSTOP)
    except OSError:
        pass
os._exit(_status & 0xFF)
