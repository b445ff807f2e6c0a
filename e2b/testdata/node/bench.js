'use strict'
// bench.js times, side by side in one run, the stock code interpreter SDK
// against Stockade's E2B wire and Stockade's own session API, from the
// same Node.js process and fetch:
//
//   runcode: runCode('1') round trip on a live sandbox, vs
//            POST /v1/sessions/{id}/exec {"code": "1"} on a live session;
//   create:  Sandbox.create() then runCode('1'), vs
//            POST /v1/sessions then its first exec.
//
// The two sides alternate, so that load on the machine falls on both.
// Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (the SDK's),
// STOCKADE_URL and E2B_API_KEY for the session API (the same agent key),
// BENCH_N round trips (default 20) and BENCH_CREATES (default 3).
// Writes one JSON object to stdout.
const { load } = require('./sdk.js')

const { ci } = load('new')
const base = process.env.STOCKADE_URL
const key = process.env.E2B_API_KEY
const n = Number(process.env.BENCH_N || 20)
const creates = Number(process.env.BENCH_CREATES || 3)

async function api(method, path, body) {
  const res = await fetch(base + path, {
    method,
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`)
  return text ? JSON.parse(text) : undefined
}

async function exec(id) {
  const cell = await api('POST', `/v1/sessions/${id}/exec`, { code: '1' })
  if (cell.status !== 'succeeded') throw new Error(`exec: ${JSON.stringify(cell)}`)
}

async function runCode(sbx) {
  const ex = await sbx.runCode('1')
  if (ex.text !== '1') throw new Error(`runCode('1'): ${JSON.stringify(ex)}`)
}

async function timed(fn) {
  const t = process.hrtime.bigint()
  await fn()
  return Number(process.hrtime.bigint() - t) / 1e6
}

function stats(ms) {
  const s = [...ms].sort((a, b) => a - b)
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))]
  return { n: s.length, median: q(0.5), p90: q(0.9), min: s[0], max: s[s.length - 1] }
}

async function main() {
  const sbx = await ci.Sandbox.create()
  const ses = await api('POST', '/v1/sessions', { runtime: 'python' })
  const sdk = []
  const own = []
  try {
    await runCode(sbx) // warm both kernels
    await exec(ses.id)
    for (let i = 0; i < n; i++) {
      sdk.push(await timed(() => runCode(sbx)))
      own.push(await timed(() => exec(ses.id)))
    }
  } finally {
    await sbx.kill().catch(() => {})
    await api('DELETE', `/v1/sessions/${ses.id}`).catch(() => {})
  }
  const sdkCreate = []
  const ownCreate = []
  for (let i = 0; i < creates; i++) {
    let s
    sdkCreate.push(await timed(async () => {
      s = await ci.Sandbox.create()
      await runCode(s)
    }))
    await s.kill()
    let id
    ownCreate.push(await timed(async () => {
      id = (await api('POST', '/v1/sessions', { runtime: 'python' })).id
      await exec(id)
    }))
    await api('DELETE', `/v1/sessions/${id}`)
  }
  const rc = { sdk: stats(sdk), api: stats(own) }
  const cr = { sdk: stats(sdkCreate), api: stats(ownCreate) }
  process.stdout.write(JSON.stringify({
    runcode: { ...rc, ratio: rc.sdk.median / rc.api.median },
    create: { ...cr, ratio: cr.sdk.median / cr.api.median },
  }) + '\n')
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
