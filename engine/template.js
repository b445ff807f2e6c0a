// The loader of a one-shot of a node template (engine/template.go): run as
// `node -e SOURCE CONFIG /tmp/main.js`, it enters the template's working
// directory, runs its Start and Ready as scripts in the program's global
// scope with their output discarded, and then runs the program as the main
// module, process.argv as a cold `node /tmp/main.js` has it. A Start or
// Ready that throws ends it with status 125 and a line on stderr that
// starts "stockade: the template's ". Start runs as a script: no top-level
// await (a session's kernel allows it).
'use strict';
{
  const cfg = JSON.parse(process.argv[1]);
  process.argv.splice(1, 2, process.argv[2]);
  const fail = (what, msg) => {
    process.stderr.write("stockade: the template's " + what + ' failed: ' + msg.replace(/\s+/g, ' ').slice(0, 400) + '\n');
    process.exit(125);
  };
  if (cfg.workdir) {
    try {
      process.chdir(cfg.workdir);
    } catch (e) {
      fail('workdir', String(e.message));
    }
  }
  const vm = require('vm');
  for (const what of ['start', 'ready']) {
    if (!cfg[what]) continue;
    const out = process.stdout.write;
    const err = process.stderr.write;
    process.stdout.write = process.stderr.write = () => true;
    let failed = null;
    try {
      vm.runInThisContext(cfg[what], { filename: '<template ' + what + '>' });
    } catch (e) {
      failed = e instanceof Error ? e.name + ': ' + e.message : String(e);
    } finally {
      process.stdout.write = out;
      process.stderr.write = err;
    }
    if (failed !== null) fail(what, failed);
  }
  require('module').runMain();
}
