// Drives the fake Vercel Sandbox API (driver/vercel/internal/fake) with
// Vercel's own SDK, unchanged: every call the vercel driver makes, as the
// SDK makes it. driver/vercel/sdk_test.go runs it with the fake's address
// in FAKE_URL and reads the JSON report it prints last.
import { Sandbox } from "@vercel/sandbox";
import { fetch as undiciFetch } from "undici";

const base = process.env.FAKE_URL;
// The SDK's client has a fixed address (https://vercel.com/api) and takes
// a fetch: this one sends its requests to the fake instead. undici's own
// fetch, as the SDK passes an undici dispatcher along.
const fetch = (url, init) => undiciFetch(String(url).replace("https://vercel.com/api", base), init);
const creds = { token: process.env.FAKE_TOKEN, teamId: process.env.FAKE_TEAM, projectId: process.env.FAKE_PROJECT };
const report = {};

const sandbox = await Sandbox.create({
  ...creds, fetch, name: "sdk-sandbox", runtime: "node24", resources: { vcpus: 1 }, timeout: 120000,
  networkPolicy: "deny-all", tags: { suite: "sdk" }, persistent: false,
});
report.created = { name: sandbox.name, status: sandbox.status };

await sandbox.writeFiles([{ path: "/tmp/hello.sh", content: Buffer.from('echo "hi $1 $A"; echo err >&2; exit 3'), mode: 0o644 }]);
const done = await sandbox.runCommand({ cmd: "/bin/sh", args: ["/tmp/hello.sh", "there"], env: { A: "1" }, timeoutMs: 60000 });
report.run = { exitCode: done.exitCode, stdout: await done.stdout(), stderr: await done.stderr() };

const long = await sandbox.runCommand({ cmd: "/bin/sh", args: ["-c", "echo started; sleep 30"], detached: true });
for await (const log of long.logs()) {
  report.logs = log;
  break;
}
await long.kill("SIGKILL");
report.killed = { exitCode: (await long.wait()).exitCode };

const buf = await sandbox.readFileToBuffer({ path: "/tmp/hello.sh", cwd: "/" });
report.read = buf && buf.toString();
report.missing = await sandbox.readFileToBuffer({ path: "/tmp/none", cwd: "/" });
await sandbox.mkDir("/tmp/made");

const got = await Sandbox.get({ ...creds, fetch, name: "sdk-sandbox" });
report.got = got.name;
const list = await Sandbox.list({ ...creds, fetch, namePrefix: "sdk-", limit: 10 });
report.listed = (await list.toArray()).map((s) => s.name);

await sandbox.stop();
await sandbox.delete();
report.ok = true;
console.log(JSON.stringify(report));
