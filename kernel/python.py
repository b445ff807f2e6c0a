# Stockade's python kernel: one interpreter that runs cells in one
# persistent namespace, speaking the kernel wire of cmd/stockade-guest
# (requests on fd 3, events on fd 4, one JSON object a line; the cell's
# output is whatever it writes to fd 1 and 2). It runs as `python3 -c
# SOURCE` (package kernel), as the sandbox's user: nothing it says is
# trusted by the host, but it keeps what it says within the wire's bounds.
#
# A cell is compiled as a module; when its last statement is an
# expression, that expression is evaluated apart and its repr, unless it is
# None, is the cell's value (as Jupyter's execute_result). An exception
# ends the cell with its name, value and traceback, without the kernel's
# own frames. Matplotlib (Agg) figures shown (pyplot.show) or left open at
# the end of the cell become image/png displays, and are closed. sys.stdin
# is the cell's stdin. SIGINT raises KeyboardInterrupt in the running cell,
# and is ignored between cells.

import ast
import importlib.machinery
import io
import linecache
import os
import signal
import sys
import traceback
import types

# The wire's encoders, bound here: a cell that replaces json.dumps or
# binascii.b2a_base64 in its modules must not cut the kernel off.
from binascii import b2a_base64 as _b2a_base64
from json import dumps as _dumps, loads as _loads

# The guest's bounds: the data of one display or value (guest.MaxDisplay),
# and each text of an exception (below the guest's 64 KiB).
MAX_DISPLAY = 1 << 20
MAX_TEXT = 60 << 10

# The wire is the kernel's own: processes that cells start do not inherit it.
os.set_inheritable(3, False)
os.set_inheritable(4, False)
_requests = os.fdopen(3, "rb")
_events = os.fdopen(4, "wb")

# Figures render off-screen; matplotlib's cache (fonts) goes to the
# sandbox's /tmp, as the image is read-only and the user has no home.
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("MPLCONFIGDIR", "/tmp/.matplotlib")
sys.stdout.reconfigure(line_buffering=True)

_KERNEL_FILE = sys._getframe().f_code.co_filename
_cell = 0
# A cell whose code starts with _HIDDEN is one the engine runs for itself
# (the reseed of every fresh restore, of a snapshot, a golden or a pool
# checkpoint: reseed in engine/golden.go), counted in _hidden: a cell's
# file is named by its number among the others, so that a restored
# kernel's first cell is <cell-1>, as a cold kernel's is. A template's
# prelude cells (engine/template.go) are not marked, so they still use up
# numbers; and a user's cell that begins with the marker is hidden too,
# which changes only its file's name.
_HIDDEN = "# stockade: hidden cell\n"
_hidden = 0
# _running is true while a cell's code runs: SIGINT interrupts it then.
# _emitting is true while an event is written: an interrupt waits
# (_deferred) until the line is whole, or the wire would break.
_running = False
_emitting = False
_deferred = False


def _emit(event):
    global _emitting, _deferred
    line = _dumps(event).encode() + b"\n"
    _emitting = True
    try:
        _events.write(line)
        _events.flush()
    finally:
        _emitting = False
    if _deferred and _running:
        _deferred = False
        raise KeyboardInterrupt


def _on_sigint(signum, frame):
    global _deferred
    if _running and _emitting:
        _deferred = True
    elif _running:
        raise KeyboardInterrupt


def _clip(text, limit, keep_end=False):
    """Returns text cut to at most limit bytes of UTF-8."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    if keep_end:
        return "...\n" + data[len(data) - limit + 4 :].decode("utf-8", "ignore")
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


def _b64(data):
    return _b2a_base64(data, newline=False).decode("ascii")


def _show(*args, **kwargs):
    """Replaces pyplot.show: the open figures become displays of the cell."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        buf = io.BytesIO()
        plt.figure(num).savefig(buf, format="png")
        data = buf.getvalue()
        if len(data) > MAX_DISPLAY:
            print(
                f"figure {num}: its PNG of {len(data)} bytes exceeds the {MAX_DISPLAY} a display may carry; "
                "lower its size or dpi",
                file=sys.stderr,
            )
            continue
        _emit({"type": "display", "cell": _cell, "mime_type": "image/png", "data": _b64(data)})
    plt.close("all")


class _PyplotHook:
    """Puts _show in place of pyplot.show when pyplot is first imported, so
    that a cell's plt.show() displays its figures where Agg's would warn."""

    def find_spec(self, name, path, target=None):
        if name != "matplotlib.pyplot":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.show = _show

        spec.loader.exec_module = exec_module
        return spec


def _run(code, filename, namespace):
    """Runs the cell and returns the value of its last expression, if any."""
    tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        return eval(compile(last, filename, "eval"), namespace)
    return None


def _traceback(e):
    """Formats e's traceback without the kernel's frames, in e and in the
    exceptions chained to it."""
    te = traceback.TracebackException(type(e), e, e.__traceback__, compact=True)
    todo, seen = [te], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list([f for f in t.stack if f.filename != _KERNEL_FILE])
        todo.extend(c for c in (t.__cause__, t.__context__) if c is not None)
        todo.extend(getattr(t, "exceptions", None) or ())
    return "".join(te.format())


def _failure(e):
    try:
        value = str(e)
    except BaseException:
        value = "<unprintable %s>" % type(e).__name__
    try:
        text = _traceback(e)
    except BaseException:
        text = ""
    return {
        "name": _clip(type(e).__name__, MAX_TEXT),
        "value": _clip(value, MAX_TEXT),
        "traceback": _clip(text, MAX_TEXT, keep_end=True),
    }


def _cell_result(req, namespace):
    global _running, _deferred, _cell, _hidden
    _cell = req["cell"]
    code = req.get("code", "")
    filename = f"<cell-{_cell - _hidden}>"
    if code.startswith(_HIDDEN):
        _hidden += 1
    # Tracebacks show the cell's lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    result = {"type": "result", "cell": _cell, "status": "ok"}
    sys.stdin = io.StringIO(req.get("stdin", ""))
    try:
        # Whatever the cell runs, its value's repr and its figures included,
        # is interruptible; the kernel's own work is not.
        try:
            _running = True
            value = _run(code, filename, namespace)
            if value is not None:
                namespace["_"] = value
                text = _clip(repr(value), MAX_DISPLAY)
                result["value"] = {"mime_type": "text/plain", "data": _b64(text.encode("utf-8", "replace"))}
        finally:
            try:
                _show()
            finally:
                _running = _deferred = False
    except BaseException as e:
        result = {"type": "result", "cell": _cell, "status": "error", "error": _failure(e)}
    finally:
        sys.stdin = sys.__stdin__
    # The cell's output reaches the pipes before its result.
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass
    return result


def _preimport():
    """Imports the modules named in the kernel's arguments (a warm pool's
    kernel, package kernel's Options.Preimport) and drops the arguments, so
    that the cells see a fresh kernel's sys.argv and sys.orig_argv, and
    the modules in sys.modules only: not as names of their namespace. The
    imports' warnings are silenced, as nothing may be written before the
    first cell: its output is all the cell's."""
    names = sys.argv[1:]
    if not names:
        return
    del sys.orig_argv[len(sys.orig_argv) - len(names) :]
    del sys.argv[1:]
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            importlib.import_module(name)


def main():
    # Cells run in a module of their own named __main__, as a script's
    # code does (pickle, dataclasses and doctest look it up there).
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    namespace = module.__dict__
    sys.meta_path.insert(0, _PyplotHook())
    signal.signal(signal.SIGINT, _on_sigint)
    _emit({"type": "ready"})
    for line in _requests:
        try:
            req = _loads(line)
        except ValueError:
            continue
        if req.get("type") == "cell":
            _emit(_cell_result(req, namespace))


_preimport()
main()
