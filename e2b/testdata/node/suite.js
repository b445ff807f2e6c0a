'use strict'
// The E2B SDK suite: E2B's stock SDKs, unchanged, against a server named by
// nothing but E2B's documented variables (E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY). e2b/sdk_test.go runs it once per SDK version and driver.
//
// Every check records, per public SDK method it calls, whether the method
// did what E2B documents; the records go to E2B_COMPAT_OUT (JSON), from
// which matrix.js writes docs/e2b-compat.md.
//
// Environment (beyond E2B's own):
//   E2B_SDK                new (e2b 2.51.0) or old (e2b 2.49.1); default new
//   E2B_COMPAT_OUT         where to write the records (JSON)
//   E2B_COMPAT_RUN         the run's label in the matrix (e.g. gvisor)
//   E2B_TEST_PAUSE         1: check pause and connect (gVisor checkpoints);
//                          else its reason for "not applicable"
//   E2B_TEST_DIR           a writable directory of the sandbox (/home/user)
//   E2B_OTHER_API_KEY      a key of another workspace (sees only 404s)
//   E2B_APPROVAL_API_KEY   a key of a workspace whose policy requires
//                          approval of every cell; with STOCKADE_URL and
//                          STOCKADE_APPROVER_KEY (its approver) the
//                          approval checks run
const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const { load, publicMethods } = require('./sdk.js')

const sdk = load(process.env.E2B_SDK || 'new')
const { Sandbox, CommandExitError, SandboxNotFoundError, FileNotFoundError, NotFoundError, TimeoutError, AuthenticationError } = sdk.core
const CI = sdk.ci.Sandbox
const dir = process.env.E2B_TEST_DIR || '/home/user'
const runLabel = process.env.E2B_COMPAT_RUN || 'run'
const tag = `suite-${process.pid}-${Date.now()}`

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[v]) throw new Error(`${v} is not set`)
}

// The matrix's rows: the public methods of this SDK version, by
// reflection on an instance made without the network.
const inventory = publicMethods(sdk, new Sandbox({ sandboxId: 'inventory', envdVersion: '0.5.7' }))
const records = []
const cells = { main: 0, approval: 0, approvalCharged: 0 }
const created = [] // every sandbox the suite made, killed at the end

// check runs fn as a node:test test and records its outcome against every
// method in methods. na (a reason) records the methods as not applicable
// without running fn.
function check(name, methods, fn, { na, timeout = 180000 } = {}) {
  test(name, { timeout }, async (t) => {
    if (na) {
      records.push({ check: name, methods, status: 'na', reason: na })
      t.skip(na)
      return
    }
    const start = Date.now()
    try {
      const r = await fn(t)
      if (r && r.unsupported) {
        // Stockade refuses the call on purpose, in E2B's error shape: ✗
        // in the matrix with the SDK's error as the reason.
        records.push({ check: name, methods, status: 'unsupported', ms: Date.now() - start, reason: r.unsupported })
        return
      }
      records.push({ check: name, methods, status: 'pass', ms: Date.now() - start })
    } catch (err) {
      records.push({ check: name, methods, status: 'fail', ms: Date.now() - start, error: describe(err) })
      throw err
    }
  })
}

function describe(err) {
  if (!(err instanceof Error)) return String(err)
  return `${err.name}: ${err.message}`.slice(0, 500)
}

// rejects awaits p and returns what it threw, failing if it did not.
async function rejects(p, what) {
  try {
    await p
  } catch (err) {
    return err
  }
  assert.fail(`${what}: did not throw`)
}

// need fails a check at once when the shared sandbox it uses was not
// created, naming the check that creates it, rather than with a TypeError.
function need(sbx, which) {
  if (!sbx) throw new Error(`the shared ${which} sandbox was not created (its create check failed)`)
  return sbx
}

// noError fails with the cell's error when it raised one.
function noError(ex) {
  assert.equal(ex.error, undefined, ex.error && `the cell raised ${ex.error.name}: ${ex.error.value}`)
  return ex
}

function stdoutOf(execution) {
  return execution.logs.stdout.join('')
}

async function track(p) {
  const s = await p
  created.push(s)
  return s
}

// The two sandboxes most checks share: one of the core SDK (template
// "base"), one of the code interpreter ("code-interpreter-v1").
let core = null
let interp = null

check('create a sandbox (core SDK) with metadata and envs', ['Sandbox.create', 'sandbox.isRunning'], async () => {
  core = await track(Sandbox.create({ metadata: { suite: tag, role: 'core' }, envs: { SUITE_VAR: 'from-create' } }))
  assert.ok(core.sandboxId, 'a sandbox id')
  assert.equal(await core.isRunning(), true)
})

check('create a code interpreter sandbox', ['Sandbox.create'], async () => {
  interp = await track(CI.create({ metadata: { suite: tag, role: 'interp' } }))
  assert.ok(interp.sandboxId)
})

check("runCode('x = 1') then runCode('x + 1') gives 2", ['sandbox.runCode'], async () => {
  need(interp, 'code interpreter')
  const first = await interp.runCode('x = 1')
  cells.main++
  assert.equal(first.error, undefined, 'no error')
  const second = await interp.runCode('x + 1')
  cells.main++
  noError(second)
  assert.equal(second.text, '2')
  assert.equal(second.error, undefined)
})

check('runCode streams stdout through onStdout', ['sandbox.runCode'], async () => {
  need(interp, 'code interpreter')
  const lines = []
  const ex = await interp.runCode('print("hello from python")', { onStdout: (m) => lines.push(m.line) })
  cells.main++
  assert.match(stdoutOf(ex), /hello from python/)
  assert.match(lines.join(''), /hello from python/)
})

check('a matplotlib plot gives a PNG result', ['sandbox.runCode'], async () => {
  need(interp, 'code interpreter')
  const ex = await interp.runCode([
    'import matplotlib',
    'import matplotlib.pyplot as plt',
    'plt.figure(figsize=(2, 1.5))',
    'plt.plot([1, 2, 3], [1, 4, 9])',
    'plt.show()',
  ].join('\n'))
  cells.main++
  assert.equal(ex.error, undefined, ex.error && `${ex.error.name}: ${ex.error.value}`)
  const png = ex.results.find((r) => r.png)
  assert.ok(png, `a result with a png among ${JSON.stringify(ex.results.map((r) => r.formats()))}`)
  const b = Buffer.from(png.png, 'base64')
  assert.deepEqual([...b.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'PNG signature')
})

check('an exception gives error.name, value and traceback', ['sandbox.runCode'], async () => {
  need(interp, 'code interpreter')
  const ex = await interp.runCode('1 / 0')
  cells.main++
  assert.ok(ex.error, 'an error')
  assert.equal(ex.error.name, 'ZeroDivisionError')
  assert.match(ex.error.value, /division by zero/)
  assert.match(ex.error.traceback, /ZeroDivisionError/)
})

check('runCode with envs', ['sandbox.runCode'], async () => {
  need(interp, 'code interpreter')
  const ex = await interp.runCode('import os\nos.environ.get("CELL_VAR")', { envs: { CELL_VAR: 'cell-value' } })
  cells.main++
  assert.equal(ex.text, "'cell-value'")
})

check('a javascript context keeps state', ['sandbox.createCodeContext', 'sandbox.runCode'], async () => {
  need(interp, 'code interpreter')
  const ctx = await interp.createCodeContext({ language: 'javascript' })
  assert.ok(ctx.id, 'a context id')
  const set = await interp.runCode('var y = 41', { context: ctx })
  cells.main++
  noError(set)
  const ex = await interp.runCode('y + 1', { context: ctx })
  cells.main++
  noError(ex)
  assert.equal(ex.text, '42')
})

check('a bash context keeps state', ['sandbox.createCodeContext', 'sandbox.runCode'], async () => {
  need(interp, 'code interpreter')
  const ctx = await interp.createCodeContext({ language: 'bash' })
  const exported = await interp.runCode('export SUITE_Z=7', { context: ctx })
  cells.main++
  noError(exported)
  const ex = await interp.runCode('echo "z=$SUITE_Z"', { context: ctx })
  cells.main++
  noError(ex)
  assert.match(stdoutOf(ex), /z=7/)
})

check('contexts: list, restart, remove', ['sandbox.createCodeContext', 'sandbox.listCodeContexts', 'sandbox.restartCodeContext', 'sandbox.removeCodeContext', 'sandbox.runCode'], async () => {
  need(interp, 'code interpreter')
  const ctx = await interp.createCodeContext({ language: 'python' })
  const listed = await interp.listCodeContexts()
  assert.ok(Array.isArray(listed) && listed.some((c) => c.id === ctx.id), `context ${ctx.id} among ${JSON.stringify(listed)}`)
  await interp.runCode('w = 5', { context: ctx })
  cells.main++
  await interp.restartCodeContext(ctx)
  const ex = await interp.runCode('"w" in globals()', { context: ctx })
  cells.main++
  assert.equal(ex.text, 'False', 'a restarted context has lost its state')
  await interp.removeCodeContext(ctx.id)
  const after = await interp.listCodeContexts()
  assert.ok(!after.some((c) => c.id === ctx.id), 'the removed context is gone')
})

check('files.write, read, list, remove', ['sandbox.files.write', 'sandbox.files.read', 'sandbox.files.list', 'sandbox.files.remove', 'sandbox.files.exists'], async () => {
  need(core, 'core')
  const p = `${dir}/suite-${tag}.txt`
  const info = await core.files.write(p, 'hello e2b')
  assert.equal(info.path, p)
  assert.equal(await core.files.read(p), 'hello e2b')
  const bytes = await core.files.read(p, { format: 'bytes' })
  assert.equal(Buffer.from(bytes).toString(), 'hello e2b')
  const entries = await core.files.list(dir)
  const e = entries.find((x) => x.path === p)
  assert.ok(e, `${p} among ${entries.map((x) => x.path)}`)
  assert.equal(e.type, 'file')
  assert.equal(e.size, 9)
  assert.equal(await core.files.exists(p), true)
  await core.files.remove(p)
  assert.equal(await core.files.exists(p), false)
  const err = await rejects(core.files.read(p), 'reading a removed file')
  assert.ok(err instanceof FileNotFoundError, `FileNotFoundError, got ${describe(err)}`)
})

check('files: writeFiles, makeDir, rename, getInfo', ['sandbox.files.writeFiles', 'sandbox.files.makeDir', 'sandbox.files.rename', 'sandbox.files.getInfo'], async () => {
  need(core, 'core')
  const d = `${dir}/suite-dir-${process.pid}`
  assert.equal(await core.files.makeDir(d), true)
  assert.equal(await core.files.makeDir(d), false, 'an existing directory')
  const infos = await core.files.writeFiles([{ path: `${d}/a.txt`, data: 'a' }, { path: `${d}/b.txt`, data: 'bb' }])
  assert.equal(infos.length, 2)
  const moved = await core.files.rename(`${d}/a.txt`, `${d}/c.txt`)
  assert.equal(moved.path, `${d}/c.txt`)
  const info = await core.files.getInfo(`${d}/b.txt`)
  assert.equal(info.type, 'file')
  assert.equal(info.size, 2)
  await core.files.remove(d)
})

check('files.watchDir sees a write', ['sandbox.files.watchDir'], async () => {
  need(core, 'core')
  const seen = []
  const h = await core.files.watchDir(dir, (ev) => seen.push(ev), { timeoutMs: 30000 })
  try {
    await core.files.write(`${dir}/watched-${process.pid}.txt`, 'w')
    for (let i = 0; i < 50 && !seen.some((e) => e.name.includes('watched-')); i++) await new Promise((r) => setTimeout(r, 100))
    assert.ok(seen.some((e) => e.name.includes('watched-')), `events ${JSON.stringify(seen)}`)
  } finally {
    await h.stop()
    await core.files.remove(`${dir}/watched-${process.pid}.txt`).catch(() => {})
  }
})

check("commands.run('echo hi; exit 3') gives stdout and exit code 3", ['sandbox.commands.run'], async () => {
  need(core, 'core')
  const err = await rejects(core.commands.run('echo hi; exit 3'), 'a command exiting 3')
  assert.ok(err instanceof CommandExitError, `CommandExitError, got ${describe(err)}`)
  cells.main++
  assert.equal(err.exitCode, 3)
  assert.equal(err.stdout, 'hi\n')
  const ok = await core.commands.run('echo ok; echo err >&2')
  cells.main++
  assert.equal(ok.exitCode, 0)
  assert.equal(ok.stdout, 'ok\n')
  assert.equal(ok.stderr, 'err\n')
})

check('a background command streamed with onStdout', ['sandbox.commands.run'], async () => {
  need(core, 'core')
  const lines = []
  const h = await core.commands.run('for i in 1 2 3; do echo line$i; sleep 0.2; done', { background: true, onStdout: (d) => lines.push(d) })
  cells.main++
  assert.ok(h.pid > 0 || h.pid === 0, 'a pid')
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(lines.join(''), 'line1\nline2\nline3\n')
})

check('commands: list, kill a background command', ['sandbox.commands.run', 'sandbox.commands.list', 'sandbox.commands.kill'], async () => {
  need(core, 'core')
  const h = await core.commands.run('sleep 30', { background: true })
  cells.main++
  try {
    const listed = await core.commands.list()
    assert.ok(listed.some((p) => p.pid === h.pid), `pid ${h.pid} among ${JSON.stringify(listed)}`)
    assert.equal(await core.commands.kill(h.pid), true)
    await rejects(h.wait(), 'a killed command')
  } finally {
    await h.kill().catch(() => {})
  }
})

check('commands: stdin, sendStdin, closeStdin', ['sandbox.commands.start', 'sandbox.commands.sendStdin', 'sandbox.commands.closeStdin'], async () => {
  need(core, 'core')
  const h = await core.commands.start('cat', { stdin: true })
  cells.main++
  try {
    await core.commands.sendStdin(h.pid, 'piped\n')
    await core.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.stdout, 'piped\n')
  } finally {
    await h.kill().catch(() => {}) // a session runs one cell at a time: leave none behind
  }
})

check('a command past its timeoutMs is ended', ['sandbox.commands.run', 'sandbox.commands.list'], async () => {
  need(core, 'core')
  const start = Date.now()
  const err = await rejects(core.commands.run('sleep 30', { timeoutMs: 2000 }), 'a command past its timeoutMs')
  assert.ok(err instanceof TimeoutError, `TimeoutError, got ${describe(err)}`)
  cells.main++
  assert.ok(Date.now() - start < 15000, `it took ${Date.now() - start} ms`)
  // Connect-Timeout-Ms ends the process too: the sandbox is free again.
  let listed = []
  for (let i = 0; i < 50; i++) {
    listed = await core.commands.list()
    if (!listed.some((p) => p.cmd === '/bin/bash' && (p.args || []).includes('sleep 30'))) break
    await new Promise((r) => setTimeout(r, 200))
  }
  assert.ok(!listed.some((p) => (p.args || []).includes('sleep 30')), `still running: ${JSON.stringify(listed)}`)
  const r = await core.commands.run('echo free')
  cells.main++
  assert.equal(r.stdout, 'free\n')
})

check('commands.connect to a running command', ['sandbox.commands.connect'], async () => {
  need(core, 'core')
  const h = await core.commands.run('sleep 1; echo done', { background: true })
  cells.main++
  try {
    const c = await core.commands.connect(h.pid)
    const r = await c.wait()
    assert.equal(r.stdout, 'done\n')
  } finally {
    await h.wait().catch(() => {})
  }
})

check('envs: from create, per command', ['Sandbox.create', 'sandbox.commands.run'], async () => {
  need(core, 'core')
  const a = await core.commands.run('echo "$SUITE_VAR"')
  cells.main++
  assert.equal(a.stdout, 'from-create\n')
  const b = await core.commands.run('echo "$CMD_VAR"', { envs: { CMD_VAR: 'per-command' } })
  cells.main++
  assert.equal(b.stdout, 'per-command\n')
})

check('commands run as /bin/bash -l with cwd', ['sandbox.commands.run'], async () => {
  need(core, 'core')
  const r = await core.commands.run('echo "$0"; shopt -q login_shell && echo login; pwd', { cwd: '/tmp' })
  cells.main++
  assert.equal(r.stdout, '/bin/bash\nlogin\n/tmp\n', 'envd runs /bin/bash -l -c CMD: $0 is /bin/bash, a login shell')
})

check('setTimeout moves the end', ['sandbox.setTimeout', 'sandbox.getInfo', 'Sandbox.getInfo', 'Sandbox.getFullInfo', 'Sandbox.setTimeout'], async () => {
  need(core, 'core')
  await core.setTimeout(600000)
  const info = await core.getInfo()
  const left = info.endAt.getTime() - Date.now()
  assert.ok(left > 500000 && left < 700000, `endAt ${info.endAt.toISOString()}: ${left} ms left, want about 600 s`)
  assert.equal(info.sandboxId, core.sandboxId)
  assert.equal(info.metadata.suite, tag)
  assert.equal(info.state, 'running')
  await Sandbox.setTimeout(core.sandboxId, 900000)
  const info2 = await Sandbox.getInfo(core.sandboxId)
  assert.ok(info2.endAt.getTime() - Date.now() > 800000, 'the static setTimeout too')
  const full = await Sandbox.getFullInfo(core.sandboxId)
  assert.equal(full.sandboxId, core.sandboxId)
})

check('Sandbox.list with metadata', ['Sandbox.list'], async () => {
  need(core, 'core')
  need(interp, 'code interpreter')
  const page = Sandbox.list({ query: { metadata: { suite: tag, role: 'core' } } })
  const items = await page.nextItems()
  assert.deepEqual(items.map((s) => s.sandboxId), [core.sandboxId])
  assert.equal(items[0].metadata.role, 'core')
  assert.equal(items[0].state, 'running')
  const all = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems()
  assert.deepEqual(all.map((s) => s.sandboxId).sort(), [core.sandboxId, interp.sandboxId].sort())
  const running = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['running'] } }).nextItems()
  assert.equal(running.length, 2)
})

check('sandbox.connect and Sandbox.connect to a running sandbox', ['Sandbox.connect', 'sandbox.connect'], async () => {
  need(core, 'core')
  const again = await Sandbox.connect(core.sandboxId)
  assert.equal(again.sandboxId, core.sandboxId)
  const r = await again.commands.run('echo same')
  cells.main++
  assert.equal(r.stdout, 'same\n')
  assert.equal(await core.connect(), core)
})

check('getMetrics', ['sandbox.getMetrics', 'Sandbox.getMetrics'], async () => {
  need(core, 'core')
  const m = await core.getMetrics()
  assert.ok(Array.isArray(m))
  await Sandbox.getMetrics(core.sandboxId)
})

check('a key of another workspace sees only 404s', ['Sandbox.connect', 'Sandbox.kill', 'Sandbox.list', 'Sandbox.getInfo'], async () => {
  need(core, 'core')
  const apiKey = process.env.E2B_OTHER_API_KEY
  const err = await rejects(Sandbox.connect(core.sandboxId, { apiKey }), 'connect with another workspace key')
  assert.ok(err instanceof SandboxNotFoundError, `SandboxNotFoundError, got ${describe(err)}`)
  assert.equal(await Sandbox.kill(core.sandboxId, { apiKey }), false)
  const e2 = await rejects(Sandbox.getInfo(core.sandboxId, { apiKey }), 'getInfo with another key')
  assert.ok(e2 instanceof SandboxNotFoundError, `SandboxNotFoundError, got ${describe(e2)}`)
  const listed = await Sandbox.list({ apiKey, query: { metadata: { suite: tag } } }).nextItems()
  assert.equal(listed.length, 0)
}, { na: process.env.E2B_OTHER_API_KEY ? undefined : 'E2B_OTHER_API_KEY not set' })

check('a bad key raises AuthenticationError', ['Sandbox.create'], async () => {
  const err = await rejects(Sandbox.create({ apiKey: 'sk_wrong_' + tag }), 'create with a bad key')
  assert.ok(err instanceof AuthenticationError, `AuthenticationError, got ${describe(err)}`)
})

check('an unknown sandbox: connect raises SandboxNotFoundError, kill gives false', ['Sandbox.connect', 'Sandbox.kill'], async () => {
  const err = await rejects(Sandbox.connect('nosuchsandbox0000'), 'connect to an unknown sandbox')
  assert.ok(err instanceof SandboxNotFoundError, `SandboxNotFoundError, got ${describe(err)}`)
  assert.equal(await Sandbox.kill('nosuchsandbox0000'), false)
})

const pauseNA = process.env.E2B_TEST_PAUSE === '1' ? undefined : (process.env.E2B_TEST_PAUSE || 'pause not requested (E2B_TEST_PAUSE)')
check('pause then connect keeps x', ['sandbox.pause', 'sandbox.betaPause', 'Sandbox.connect', 'sandbox.runCode'], async () => {
  need(interp, 'code interpreter')
  await interp.runCode('x = 41')
  cells.main++
  assert.equal(await interp.pause(), true)
  assert.equal(await interp.betaPause(), false, 'pausing a paused sandbox gives false')
  const [paused] = await Sandbox.list({ query: { metadata: { suite: tag, role: 'interp' } } }).nextItems()
  assert.equal(paused.state, 'paused')
  const back = await CI.connect(interp.sandboxId)
  const ex = await back.runCode('x + 1')
  cells.main++
  assert.equal(ex.text, '42')
}, { na: pauseNA, timeout: 300000 })

check('static pause', ['Sandbox.pause', 'Sandbox.betaPause'], async () => {
  need(interp, 'code interpreter')
  assert.equal(await Sandbox.pause(interp.sandboxId), true)
  assert.equal(await Sandbox.betaPause(interp.sandboxId), false)
  await Sandbox.connect(interp.sandboxId)
}, { na: pauseNA, timeout: 300000 })

check('snapshots', ['sandbox.createSnapshot', 'sandbox.listSnapshots', 'Sandbox.createSnapshot', 'Sandbox.listSnapshots', 'Sandbox.deleteSnapshot'], async () => {
  need(core, 'core')
  const snap = await core.createSnapshot()
  assert.ok(snap.snapshotId)
  const mine = await core.listSnapshots().nextItems()
  assert.ok(mine.some((x) => x.snapshotId === snap.snapshotId))
  const all = await Sandbox.listSnapshots().nextItems()
  assert.ok(all.some((x) => x.snapshotId === snap.snapshotId))
  // Sandbox.create(snapshotId) starts a sandbox from it, with its files.
  await core.files.write(`${dir}/snap-${process.pid}.txt`, 'before')
  const snap2 = await core.createSnapshot({ name: `suite-${process.pid}` })
  assert.deepEqual(snap2.names, [`suite-${process.pid}`])
  await core.files.write(`${dir}/snap-${process.pid}.txt`, 'after')
  const from = await track(Sandbox.create(snap2.snapshotId))
  assert.equal(await from.files.read(`${dir}/snap-${process.pid}.txt`), 'before')
  assert.equal(await from.kill(), true)
  assert.equal(await Sandbox.deleteSnapshot(snap2.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'deleting a deleted snapshot gives false')
  await Sandbox.createSnapshot(core.sandboxId).then((s) => Sandbox.deleteSnapshot(s.snapshotId))
}, { na: pauseNA, timeout: 300000 })

check('fork', ['sandbox.fork', 'Sandbox.fork'], async () => {
  need(core, 'core')
  await core.files.write(`${dir}/fork-${process.pid}.txt`, 'forked')
  const forks = await core.fork()
  const f = Array.isArray(forks) ? forks[0] : forks
  assert.ok(!(f instanceof Error), `a fork, got ${describe(f)}`)
  created.push(f)
  assert.equal(await f.files.read(`${dir}/fork-${process.pid}.txt`), 'forked')
  const more = await Sandbox.fork(core.sandboxId)
  for (const m of [].concat(more)) if (!(m instanceof Error)) created.push(m)
}, { na: pauseNA, timeout: 300000 })

check('snapshots and fork refused without checkpoints', ['sandbox.createSnapshot', 'Sandbox.createSnapshot', 'sandbox.fork', 'Sandbox.fork'], async () => {
  need(core, 'core')
  const err = await rejects(core.createSnapshot(), 'createSnapshot')
  assert.match(err.message, /cannot be snapshotted or forked/, describe(err))
  const ferr = await rejects(core.fork(), 'fork')
  assert.match(ferr.message, /cannot be snapshotted or forked/, describe(ferr))
  return { unsupported: `this driver cannot checkpoint: ${describe(err)}` }
}, { na: pauseNA ? undefined : 'the driver checkpoints: the snapshots and fork checks ran' })

check('updateNetwork', ['sandbox.updateNetwork', 'Sandbox.updateNetwork'], async () => {
  need(core, 'core')
  const err = await rejects(core.updateNetwork({ allowOut: [] }), 'updateNetwork')
  assert.equal(err.name, 'SandboxError', describe(err))
  assert.match(err.message, /^400: .*network cannot be changed/)
  const again = await rejects(Sandbox.updateNetwork(core.sandboxId, { allowOut: [] }), 'Sandbox.updateNetwork')
  assert.equal(again.message, err.message)
  const gone = await rejects(Sandbox.updateNetwork('no-such-sandbox', { allowOut: [] }), 'updateNetwork of an unknown sandbox')
  assert.equal(gone.name, 'SandboxNotFoundError', describe(gone))
  return { unsupported: `refused by design: ${describe(err)}` }
})

check('getHost', ['sandbox.getHost'], null, { na: 'E2B_SANDBOX_URL routes by the E2b-Sandbox-Id and E2b-Sandbox-Port headers; getHost names E2B\'s per-port DNS names ({port}-{id}.{domain}), which a single Stockade address does not serve' })

check('MCP gateway', ['sandbox.getMcpUrl', 'sandbox.getMcpToken'], null, { na: 'Stockade has no mcp-gateway template (Sandbox.create({ mcp })); its own MCP server is /mcp on the daemon' })

check('downloadUrl and uploadUrl', ['sandbox.downloadUrl', 'sandbox.uploadUrl'], async () => {
  need(core, 'core')
  const p = `${dir}/url-${process.pid}.txt`
  await core.files.write(p, 'by url')
  const res = await fetch(await core.downloadUrl(p))
  assert.equal(res.status, 200, `GET downloadUrl: ${res.status}`)
  assert.equal(await res.text(), 'by url')
  const form = new FormData()
  form.append('file', new Blob(['up']), p)
  const up = await fetch(await core.uploadUrl(p), { method: 'POST', body: form })
  assert.equal(up.status, 200, `POST uploadUrl: ${up.status}`)
})

check('kill, then every call gives the SDK\'s not-found error', ['sandbox.kill', 'Sandbox.kill', 'Sandbox.connect', 'Sandbox.getInfo', 'sandbox.setTimeout', 'sandbox.isRunning', 'sandbox.commands.run', 'sandbox.files.read', 'sandbox.runCode'], async () => {
  need(interp, 'code interpreter')
  const victim = interp
  // A stream in flight is cut when its sandbox is killed.
  const inflight = await victim.commands.run('sleep 60', { background: true })
  cells.main++
  const cut = inflight.wait().then(() => 'ended', (e) => e)
  assert.equal(await victim.kill(), true)
  const how = await Promise.race([cut, new Promise((r) => setTimeout(r, 15000, 'still running 15 s after the kill'))])
  assert.ok(how instanceof Error, `the command's stream: ${describe(how)}`)
  assert.equal(await victim.kill(), false, 'a second kill gives false')
  assert.equal(await Sandbox.kill(victim.sandboxId), false)
  for (const [what, call] of [
    ['Sandbox.connect', () => Sandbox.connect(victim.sandboxId)],
    ['Sandbox.getInfo', () => Sandbox.getInfo(victim.sandboxId)],
    ['sandbox.setTimeout', () => victim.setTimeout(60000)],
    ['sandbox.commands.run', () => victim.commands.run('echo hi')],
  ]) {
    const err = await rejects(call(), `${what} after kill`)
    assert.ok(err instanceof SandboxNotFoundError, `${what}: SandboxNotFoundError, got ${describe(err)}`)
  }
  // A dead sandbox's data plane answers 502, which the SDKs raise as
  // TimeoutError ("sandbox timeout"), as they do against E2B.
  const rd = await rejects(victim.files.read(`${dir}/x`), 'files.read after kill')
  assert.ok(rd instanceof TimeoutError, `files.read: TimeoutError, got ${describe(rd)}`)
  const rc = await rejects(victim.runCode('1'), 'runCode after kill')
  assert.ok(rc instanceof TimeoutError, `runCode: TimeoutError, got ${describe(rc)}`)
  assert.equal(await victim.isRunning(), false)
})

// Approval: a workspace whose policy requires a human for every cell.
const approvalNA = process.env.E2B_APPROVAL_API_KEY && process.env.STOCKADE_URL && process.env.STOCKADE_APPROVER_KEY ? undefined : 'E2B_APPROVAL_API_KEY, STOCKADE_URL or STOCKADE_APPROVER_KEY not set'

async function stockade(method, path, body) {
  const res = await fetch(process.env.STOCKADE_URL + path, {
    method,
    headers: { Authorization: `Bearer ${process.env.STOCKADE_APPROVER_KEY}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`)
  return text ? JSON.parse(text) : undefined
}

// pendingApproval waits for an approval request not in seen, while
// pending (the promise the SDK awaits) stays unsettled.
async function pendingApproval(seen, pending) {
  let settled = false
  pending.then(() => { settled = true }, () => { settled = true })
  for (let i = 0; i < 600; i++) {
    const page = await stockade('GET', '/v1/approvals?status=pending')
    const a = (page.items || []).find((x) => !seen.has(x.id))
    if (a) {
      assert.equal(settled, false, 'the SDK call waited for the approval')
      seen.add(a.id)
      return a
    }
    if (settled) assert.fail(`the SDK call ended before any approval was requested: ${describe(await pending.catch((e) => e))}`)
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.fail('no approval was requested within 60 s')
}

check('an approval-gated runCode waits, runs once approved; a denied one raises', ['sandbox.runCode'], async () => {
  const apiKey = process.env.E2B_APPROVAL_API_KEY
  const seen = new Set()
  // Creating the sandbox needs no approval under "required" (cells do);
  // approve anything it asks for anyway, so that the check is about runCode.
  const creating = CI.create({ apiKey, metadata: { suite: tag, role: 'approval' } })
  let gated
  for (;;) {
    const r = await Promise.race([creating.then((s) => ({ s })), new Promise((r) => setTimeout(r, 200, {}))])
    if (r.s) { gated = r.s; break }
    const page = await stockade('GET', '/v1/approvals?status=pending')
    for (const a of page.items || []) { seen.add(a.id); await stockade('POST', `/v1/approvals/${a.id}/approve`, {}) }
  }
  created.push(gated)
  const running = gated.runCode('21 * 2')
  const a = await pendingApproval(seen, running)
  await new Promise((r) => setTimeout(r, 1500)) // the SDK keeps waiting
  await stockade('POST', `/v1/approvals/${a.id}/approve`, { reason: 'e2b suite' })
  const ex = await running
  cells.approval++
  cells.approvalCharged++
  assert.equal(ex.text, '42')
  const denied = gated.runCode('1 + 1')
  const d = await pendingApproval(seen, denied)
  await stockade('POST', `/v1/approvals/${d.id}/deny`, { reason: 'e2b suite denies' })
  cells.approval++
  const err = await rejects(denied, 'a denied runCode')
  assert.ok(err instanceof Error, `an Error, got ${describe(err)}`)
}, { na: approvalNA, timeout: 300000 })

after(async () => {
  for (const s of created) await s.kill().catch(() => {})
  const out = process.env.E2B_COMPAT_OUT
  if (!out) return
  const doc = {
    sdk: sdk.label,
    codeInterpreter: `@e2b/code-interpreter@${sdk.ciVersion}`,
    run: runLabel,
    methods: inventory,
    cells,
    records,
  }
  fs.writeFileSync(out, JSON.stringify(doc, null, 1))
})
