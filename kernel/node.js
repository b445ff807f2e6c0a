// Stockade's node kernel: one node process whose global context keeps the
// state of every cell, speaking the kernel wire of cmd/stockade-guest
// (requests on fd 3, events on fd 4, one JSON object a line; the cell's
// output is whatever it writes to fd 1 and 2). It runs as `node -e SOURCE`
// (package kernel), as the sandbox's user: nothing it says is trusted by
// the host, but it keeps what it says within the wire's bounds.
//
// Cells are evaluated by V8's inspector in REPL mode, as a browser's
// console evaluates what is typed in it: top-level await works, let, const,
// class and function declarations stay for the next cells (and may be
// declared again), and the completion value of the cell, unless it is
// undefined, is its value (util.inspect'ed, as node's REPL prints it). A
// throw ends the cell with the error's name, message and stack, without
// the kernel's frames. process.stdin is the cell's stdin. SIGINT
// interrupts the cell: its synchronous part is stopped where it runs; a
// cell waiting for a promise is given up (what it still runs later is not
// the next cell's concern, as in node's REPL). An interrupt that comes just
// as the synchronous part ends can be lost, or end the next cell instead:
// node's breakOnSigint watchdog, stopping, drops the signal or leaves its
// termination pending. Interrupting again ends the waiting cell.
'use strict';
(() => {
  const fs = require('fs');
  const inspector = require('inspector');
  const readline = require('readline');
  const stream = require('stream');
  const util = require('util');
  const vm = require('vm');

  // The guest's bounds: the data of one value (guest.MaxDisplay), and each
  // text of an error (below the guest's 64 KiB).
  const MAX_DISPLAY = 1 << 20;
  const MAX_TEXT = 60 << 10;

  const session = new inspector.Session();
  session.connect();

  // writeAll writes all of b to fd, waiting while a full pipe refuses it.
  function writeAll(fd, b) {
    for (let off = 0; off < b.length;) {
      try {
        off += fs.writeSync(fd, b, off);
      } catch (e) {
        if (e.code !== 'EAGAIN') {
          throw e;
        }
      }
    }
  }

  function emit(event) {
    writeAll(4, Buffer.from(JSON.stringify(event) + '\n'));
  }

  // A cell's output is written at once, synchronously, as it writes it:
  // so it is in the pipe before the cell's result is on the wire (the
  // guest gives what the pipes hold to the cell of the next result), and
  // an interrupt cannot leave a stream's write half done, which would
  // hold back the output of the next cells.
  for (const [s, fd] of [[process.stdout, 1], [process.stderr, 2]]) {
    s.write = function write(chunk, encoding, cb) {
      if (typeof encoding === 'function') {
        [cb, encoding] = [encoding, undefined];
      }
      const b = typeof chunk === 'string' ? Buffer.from(chunk, encoding) : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      writeAll(fd, b);
      if (cb) {
        process.nextTick(cb);
      }
      return true;
    };
  }

  function clip(text, limit, keepEnd) {
    const b = Buffer.from(text);
    if (b.length <= limit) {
      return text;
    }
    // Cut on a character's boundary: toString replaces a cut one.
    return keepEnd ? '...\n' + b.subarray(b.length - limit + 8).toString() : b.subarray(0, limit - 8).toString() + '...';
  }

  // interruptibly runs fn so that SIGINT stops the JavaScript it runs, the
  // code it makes the inspector run included: vm's breakOnSigint watches
  // the script that calls it.
  const caller = vm.createContext({ fn: null });
  const callScript = new vm.Script('fn()');
  function interruptibly(fn) {
    caller.fn = fn;
    try {
      return callScript.runInContext(caller, { breakOnSigint: true });
    } finally {
      caller.fn = null;
    }
  }

  class Interrupted extends Error {}
  // pending gives up the cell that waits for its promise.
  let pending = null;
  process.on('SIGINT', () => {
    if (pending) {
      pending(new Interrupted());
    }
  });
  // A cell's stray callback or promise must not end the kernel.
  const uncaught = (what) => (e) => process.stderr.write(what + ' ' + (util.types.isNativeError(e) ? cleanStack(String(e.stack)) : util.inspect(e)) + '\n');
  process.on('uncaughtException', uncaught('Uncaught'));
  process.on('unhandledRejection', uncaught('Uncaught (in promise)'));

  function post(method, params) {
    let out;
    session.post(method, params, (err, res) => { out = { err, res }; });
    if (!out) {
      throw new Error(method + ' did not answer at once');
    }
    if (out.err) {
      throw out.err;
    }
    return out.res;
  }

  // cleanStack cuts a stack where the kernel's frames begin: the cell's
  // code runs below the inspector's Session.post.
  function cleanStack(stack) {
    const lines = stack.split('\n');
    const i = lines.findIndex((l) => /^\s+at .*\(node:inspector[:)]/.test(l));
    return (i < 0 ? lines : lines.slice(0, i)).join('\n');
  }

  // describe runs in the cell's context, called through the inspector on
  // the cell's value or exception.
  function describe(v, asError) {
    if (!asError) {
      return { text: clip(util.inspect(v), MAX_DISPLAY) };
    }
    if (util.types.isNativeError(v) || v instanceof Error) {
      return {
        name: clip(String(v.name), MAX_TEXT),
        value: clip(String(v.message), MAX_TEXT),
        traceback: clip(cleanStack(String(v.stack)), MAX_TEXT, true),
      };
    }
    const text = clip(util.inspect(v), MAX_TEXT);
    return { name: 'Uncaught', value: text, traceback: clip('Uncaught ' + text, MAX_TEXT) };
  }
  const key = 'stockade.kernel.describe.' + process.pid;
  globalThis[key] = describe;
  const describer = post('Runtime.evaluate', { expression: `globalThis[${JSON.stringify(key)}]`, objectGroup: 'kernel' }).result.objectId;
  delete globalThis[key];

  // describeRemote calls describe on a value of the inspector's.
  function describeRemote(remote, asError) {
    let arg = { value: remote.value };
    if ('objectId' in remote) {
      arg = { objectId: remote.objectId };
    } else if ('unserializableValue' in remote) {
      arg = { unserializableValue: remote.unserializableValue };
    }
    const r = interruptibly(() => post('Runtime.callFunctionOn', {
      objectId: describer,
      functionDeclaration: 'function (v, asError) { return this(v, asError) }',
      arguments: [arg, { value: asError }],
      returnByValue: true,
    }));
    if (r.exceptionDetails) {
      const text = 'the kernel could not describe it: ' + r.exceptionDetails.text;
      return asError ? { name: 'Error', value: text, traceback: '' } : { text };
    }
    return r.result.value;
  }

  function evaluate(expression) {
    return new Promise((resolve, reject) => {
      pending = reject;
      interruptibly(() => session.post('Runtime.evaluate', { expression, replMode: true, awaitPromise: true, objectGroup: 'cell' },
        (err, res) => (err ? reject(err) : resolve(res))));
    }).finally(() => { pending = null; });
  }

  function setStdin(text) {
    let s = null;
    Object.defineProperty(process, 'stdin', {
      configurable: true,
      enumerable: true,
      get: () => s || (s = stream.Readable.from([Buffer.from(text)])),
    });
  }

  function interrupted(e) {
    return e instanceof Interrupted || (e && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED');
  }

  async function runCell(req) {
    const n = req.cell;
    const result = { type: 'result', cell: n, status: 'ok' };
    setStdin(req.stdin || '');
    try {
      const r = await evaluate(String(req.code) + '\n//# sourceURL=cell-' + n);
      if (r.exceptionDetails) {
        const d = r.exceptionDetails;
        const error = describeRemote(d.exception || {}, true);
        if (error.name === 'SyntaxError' && !error.traceback.includes('cell-' + n)) {
          error.traceback += `\n    at cell-${n}:${d.lineNumber + 1}:${d.columnNumber + 1}`;
        }
        result.status = 'error';
        result.error = error;
      } else if (r.result.type !== 'undefined') {
        const text = describeRemote(r.result, false).text;
        result.value = { mime_type: 'text/plain', data: Buffer.from(text).toString('base64') };
      }
    } catch (e) {
      result.status = 'error';
      result.error = interrupted(e)
        ? { name: 'KeyboardInterrupt', value: 'the cell was interrupted', traceback: '' }
        : { name: 'KernelError', value: clip(String(e && e.message), MAX_TEXT), traceback: '' };
    } finally {
      session.post('Runtime.releaseObjectGroup', { objectGroup: 'cell' });
    }
    return result;
  }

  async function main() {
    emit({ type: 'ready' });
    const lines = readline.createInterface({ input: fs.createReadStream(null, { fd: 3 }), crlfDelay: Infinity });
    for await (const line of lines) {
      let req;
      try {
        req = JSON.parse(line);
      } catch {
        continue;
      }
      if (req && req.type === 'cell') {
        emit(await runCell(req));
      }
    }
    process.exit(0);
  }
  main();
})();
