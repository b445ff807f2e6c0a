package e2b

import (
	"encoding/json"
	"strings"
)

// ciHelperModule names the helper's module in the kernel's sys.modules;
// its version changes with its source, so that a kernel that defined an
// older one defines this one.
const ciHelperModule = "_stockade_e2b_1"

// ciHelper is the python kernel's side of contexts (see
// interpreter_contexts.go): run(lang, ctx, code, env, cwd, restart, drop)
// runs code in context ctx and returns the value of its last expression
// (a python context's), which the kernel reports as the cell's value.
// It is compiled as "<string>", the kernel's own file name, so that the
// kernel leaves its frames out of tracebacks, as it does its own.
//
// A bash or node context is a process kept per context, in a session of
// its own; a cell's code reaches bash as a file it sources (its stdin is
// /dev/null), node as a JSON line its driver evaluates in its one global
// scope. Their output is copied to the kernel's fd 1 and 2, the cell's
// output, until a random marker each prints after the cell. SIGINT (an
// interrupt of the cell) is passed on to the process's group; if it
// does not end the cell within 2s, the process is killed, and the next
// cell of the context starts a new one.
const ciHelper = `
import ast, linecache, os, secrets, shutil, signal, subprocess, sys, threading, types

_mod = types.ModuleType(` + "\"" + ciHelperModule + "\"" + `)
_spaces = {}
_procs = {}

_NODE = r"""
const vm = require('vm'), util = require('util');
globalThis.require = require;
let buf = '', chain = Promise.resolve();
process.stdin.setEncoding('utf8');
process.stdin.on('data', d => {
  buf += d;
  let i;
  while ((i = buf.indexOf('\n')) >= 0) {
    const m = JSON.parse(buf.slice(0, i));
    buf = buf.slice(i + 1);
    chain = chain.then(async () => {
      const out = {};
      try {
        let v = vm.runInThisContext(m.code, {filename: '<cell>'});
        if (v && typeof v.then === 'function') v = await v;
        if (v !== undefined) out.value = util.inspect(v);
      } catch (e) {
        const stack = String((e && e.stack) || '').split('\n').filter(l => !/node:vm|node:internal|\[eval\]/.test(l)).join('\n');
        out.error = {name: (e && e.name) || 'Error', value: (e && e.message) || String(e), traceback: stack};
      }
      process.stderr.write(m.marker + '\n');
      process.stdout.write(m.marker + ' ' + JSON.stringify(out) + '\n');
    });
  }
});
"""


class NodeUnavailable(Exception):
    pass


class ContextExited(Exception):
    pass


class BashError(Exception):
    pass


class _Value:
    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def _main():
    return sys.modules["__main__"].__dict__


def _namespace(ctx):
    if ctx == "python":
        return _main()
    ns = _spaces.get(ctx)
    if ns is None:
        ns = types.ModuleType("__main__").__dict__
        _spaces[ctx] = ns
    return ns


def _forget(ctx):
    if ctx == "python":
        ns = _main()
        keep = {k: ns[k] for k in ("__name__", "__builtins__", "__doc__") if k in ns}
        ns.clear()
        ns.update(keep)
    _spaces.pop(ctx, None)
    for key in [k for k in _procs if k[1] == ctx]:
        p = _procs.pop(key)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()


def _python(ctx, code):
    ns = _namespace(ctx)
    name = "<%s>" % ctx
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tree = ast.parse(code, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), ns)
    if last is not None:
        return eval(compile(last, name, "eval"), ns)
    return None


def _process(lang, ctx, cwd):
    key = (lang, ctx)
    p = _procs.get(key)
    if p is not None and p.poll() is None:
        return p
    if lang == "bash":
        # A trap (not an ignore, which children would inherit) keeps
        # bash, and the context's state, past an interrupt of its cell:
        # it ends the cell's sourced file (status 130), as ^C ends a
        # command line, and does nothing between cells.
        argv = ["bash", "--noprofile", "--norc", "-c",
                "trap 'return 130 2>/dev/null' INT; while IFS= read -r __stockade_line; do eval \"$__stockade_line\"; done"]
    else:
        if shutil.which("node") is None:
            raise NodeUnavailable("javascript contexts run node in the sandbox, and this sandbox's image has no node "
                                  "(the python image has none): create the sandbox from a template whose image installs nodejs")
        argv = ["node", "-e", _NODE]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=cwd if os.path.isdir(cwd) else None, start_new_session=True)
    _procs[key] = p
    return p


def _pump(fd, to, marker, box):
    buf = b""
    keep = len(marker) - 1
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            if buf:
                os.write(to, buf)
            box.append(None)
            return
        buf += chunk
        i = buf.find(marker)
        if i >= 0:
            if i:
                os.write(to, buf[:i])
            rest = buf[i + len(marker):]
            while b"\n" not in rest:
                more = os.read(fd, 65536)
                if not more:
                    break
                rest += more
            box.append(rest.split(b"\n", 1)[0])
            return
        if len(buf) > keep:
            os.write(to, buf[:len(buf) - keep])
            buf = buf[len(buf) - keep:]


def _shell(lang, ctx, code, env, cwd):
    p = _process(lang, ctx, cwd)
    token = secrets.token_hex(12)
    marker = ("__stockade_e2b_" + token).encode()
    if lang == "bash":
        path = "/tmp/.stockade-e2b-%s.sh" % token
        with open(path, "w") as f:
            f.write(code)
        lines = ["export %s=%s" % (k, _quote(v)) for k, v in env.items()]
        # One line: the loop's read comes between two, and sets $?.
        lines += [". %s </dev/null; __stockade_rc=$?; rm -f %s" % (path, path)]
        lines += ["unset %s" % k for k in env]
        lines += ["printf '%s\\n' >&2" % marker.decode(), "printf '%s %%d\\n' $__stockade_rc" % marker.decode()]
        msg = "\n".join(lines) + "\n"
    else:
        import json
        msg = json.dumps({"code": code, "marker": marker.decode()}) + "\n"
    sys.stdout.flush()
    sys.stderr.flush()
    out, err = [], []
    threads = [threading.Thread(target=_pump, args=(p.stdout.fileno(), 1, marker, out), daemon=True),
               threading.Thread(target=_pump, args=(p.stderr.fileno(), 2, marker, err), daemon=True)]
    for t in threads:
        t.start()
    try:
        p.stdin.write(msg.encode())
        p.stdin.flush()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.05)
    except KeyboardInterrupt:
        try:
            os.killpg(p.pid, signal.SIGINT)
        except OSError:
            pass
        for t in threads:
            t.join(2)
        if any(t.is_alive() for t in threads) or lang == "javascript":
            _forget(ctx)
        raise
    except BrokenPipeError:
        for t in threads:
            t.join(2)
    if not out or out[0] is None:
        _procs.pop((lang, ctx), None)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        rc = p.wait()
        raise ContextExited("%s exited (status %d) during the cell: the context's state is lost, its next cell starts a new %s" % (lang, rc, lang))
    if lang == "bash":
        rc = int(out[0].strip() or b"0")
        if rc != 0:
            raise BashError("exit status %d" % rc)
        return None
    import json
    res = json.loads(out[0].decode("utf-8", "replace") or "{}")
    e = res.get("error")
    if e:
        cls = type(str(e.get("name") or "Error"), (Exception,), {})
        exc = cls(e.get("value", ""))
        if e.get("traceback"):
            exc.add_note(e["traceback"])
        raise exc
    if "value" in res:
        return _Value(res["value"])
    return None


def _quote(v):
    return "'" + v.replace("'", "'\\''") + "'"


def run(lang, ctx, code, env, cwd, restart, drop):
    for d in drop:
        _forget(d)
    if restart:
        _forget(ctx)
    if lang != "python":
        return _shell(lang, ctx, code, env, cwd)
    saved = {k: os.environ.get(k) for k in env}
    here = os.getcwd()
    os.environ.update(env)
    try:
        if ctx != "python" and os.path.isdir(cwd):
            os.chdir(cwd)
        return _python(ctx, code)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if os.getcwd() != here:
            os.chdir(here)


for _k in ("NodeUnavailable", "ContextExited", "BashError", "run"):
    setattr(_mod, _k, globals()[_k])
sys.modules[` + "\"" + ciHelperModule + "\"" + `] = _mod
`

// ciPyString is s as a Python string literal (JSON's escapes are
// Python's, and Go writes no \/).
func ciPyString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// ciHelperCell is the cell that runs code in context ctx of a python
// kernel: the helper's definition where the kernel lacks it, then its
// call, whose value is the cell's.
func ciHelperCell(ctx *ciContext, code string, env map[string]string, restart bool, drop []string) string {
	var b strings.Builder
	b.WriteString("# Stockade's E2B context helper: runs the code below in context " + ctx.ID + " (" + ctx.Language + ")\n")
	b.WriteString(`__import__("sys").modules.get("` + ciHelperModule + `") or exec(compile(` + ciPyString(ciHelper) + `, "<string>", "exec"), {"__name__": "` + ciHelperModule + `"})` + "\n")
	envJSON, _ := json.Marshal(env)
	if env == nil {
		envJSON = []byte("{}")
	}
	dropJSON, _ := json.Marshal(drop)
	if drop == nil {
		dropJSON = []byte("[]")
	}
	pyBool := map[bool]string{true: "True", false: "False"}
	b.WriteString(`__import__("sys").modules["` + ciHelperModule + `"].run(` + ciPyString(ctx.Language) + ", " + ciPyString(ctx.ID) + ", " +
		ciPyString(code) + ", " + string(envJSON) + ", " + ciPyString(ctx.Cwd) + ", " + pyBool[restart] + ", " + string(dropJSON) + ")\n")
	return b.String()
}

// ciNodeCell is the cell that runs code in a node kernel: as written, or
// after setting env_vars in process.env (where they stay: the node
// kernel's scope is the one context).
func ciNodeCell(code string, env map[string]string) string {
	if len(env) == 0 {
		return code
	}
	envJSON, _ := json.Marshal(env)
	return "Object.assign(process.env, " + string(envJSON) + ");\n" + code
}
