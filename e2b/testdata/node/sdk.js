'use strict'
// Loads one version of E2B's stock SDKs, unchanged, from node_modules.
//
// "new" is e2b 2.51.0 with @e2b/code-interpreter 2.8.0 over it. "old" is
// e2b 2.49.1 (installed under the alias e2b-old) with the same
// code-interpreter over it: npm dedupes @e2b/code-interpreter (it asks for
// e2b ^2.48.0) onto the e2b of the install, so a program that pins
// e2b@2.49.1 gets exactly that pair; here the interpreter's require("e2b")
// is pointed at the alias, which is what its install would resolve.
const Module = require('node:module')
const fs = require('node:fs')
const path = require('node:path')

function load(which) {
  if (which !== 'new' && which !== 'old') throw new Error(`E2B_SDK must be new or old, got ${which}`)
  const coreName = which === 'old' ? 'e2b-old' : 'e2b'
  if (which === 'old') {
    const resolve = Module._resolveFilename
    Module._resolveFilename = function (request, parent, ...rest) {
      if (request === 'e2b') request = 'e2b-old'
      return resolve.call(this, request, parent, ...rest)
    }
  }
  const core = require(coreName)
  const ci = require('@e2b/code-interpreter')
  if (Object.getPrototypeOf(ci.Sandbox) !== core.Sandbox) {
    throw new Error(`@e2b/code-interpreter does not run over ${coreName}`)
  }
  const coreDir = path.dirname(require.resolve(`${coreName}/package.json`))
  const ciDir = path.dirname(require.resolve('@e2b/code-interpreter/package.json'))
  const version = require(`${coreName}/package.json`).version
  return {
    which,
    core,
    ci,
    label: `e2b@${version}`,
    version,
    ciVersion: require('@e2b/code-interpreter/package.json').version,
    coreTypes: fs.readFileSync(path.join(coreDir, 'dist', 'index.d.ts'), 'utf8'),
    ciTypes: fs.readFileSync(path.join(ciDir, 'dist', 'index.d.ts'), 'utf8'),
  }
}

// hiddenMembers returns the member names a declaration file marks as not
// public: private or protected, or documented @hidden or @internal.
function hiddenMembers(dts) {
  const hidden = new Set()
  const re = /(\/\*\*(?:[^*]|\*(?!\/))*\*\/\s*)?^[ \t]*((?:(?:private|protected|public|static|readonly|abstract|async|get|set)\s+)*)([A-Za-z_$][\w$]*)\s*[(<?:!;]/gm
  let m
  while ((m = re.exec(dts))) {
    const doc = m[1] || ''
    const mods = m[2] || ''
    if (/\b(private|protected)\b/.test(mods) || /@hidden|@internal/.test(doc)) hidden.add(m[3])
  }
  return hidden
}

// publicMethods lists the public methods of the classes the matrix covers,
// by reflection on the loaded classes and instances, less what the
// declaration files hide.
function publicMethods(sdk, sbx) {
  const hidden = new Set([...hiddenMembers(sdk.coreTypes), ...hiddenMembers(sdk.ciTypes)])
  const names = (obj, stop) => {
    const out = new Set()
    for (let o = obj; o && o !== stop; o = Object.getPrototypeOf(o)) {
      for (const n of Object.getOwnPropertyNames(o)) {
        const d = Object.getOwnPropertyDescriptor(o, n)
        if (n === 'constructor' || typeof d.value !== 'function' || hidden.has(n)) continue
        out.add(n)
      }
    }
    return [...out].sort()
  }
  const CoreSandbox = sdk.core.Sandbox
  const ciOwn = Object.getOwnPropertyNames(sdk.ci.Sandbox.prototype).filter((n) => n !== 'constructor' && typeof Object.getOwnPropertyDescriptor(sdk.ci.Sandbox.prototype, n).value === 'function' && !hidden.has(n))
  return {
    Sandbox: names(CoreSandbox, Function.prototype).map((n) => `Sandbox.${n}`),
    sandbox: names(CoreSandbox.prototype, Object.prototype).map((n) => `sandbox.${n}`),
    'sandbox.files': names(Object.getPrototypeOf(sbx.files), Object.prototype).map((n) => `sandbox.files.${n}`),
    'sandbox.commands': names(Object.getPrototypeOf(sbx.commands), Object.prototype).map((n) => `sandbox.commands.${n}`),
    'code-interpreter': ciOwn.sort().map((n) => `sandbox.${n}`),
  }
}

module.exports = { load, publicMethods, hiddenMembers }
