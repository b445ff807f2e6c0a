// stateless.mjs speaks MCP 2026-07-28 (stateless: server/discover, no
// initialize, no Mcp-Session-Id) to Stockade's /mcp with the official
// TypeScript SDK's v2 client, and prints what it saw as JSON on stdout.
//
//   node stateless.mjs run URL KEY    lists the tools and runs print(6*7)
//   node stateless.mjs task URL KEY   runs print(6*7) where a human must
//                                     approve it: the call becomes a task
//                                     (the Tasks extension), polled to its end;
//                                     on stderr: "task ID", then
//                                     "tasks/get STATUS" after each poll
//
// The task mode drives the task with the official Tasks extension package
// (@modelcontextprotocol/ext-tasks). The SDK's client (2.4.0) rejects a
// tools/call answered with resultType "task" on 2026-07-28, so the
// package takes a raw dispatch from its host for tools/call and tasks/*,
// as its README says: rawDispatch below posts the package's framed
// request to /mcp as the SDK's transport would.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { createTaskSessionFromClient, resultFromTaskOutcome } from "@modelcontextprotocol/ext-tasks/client";

const VERSION = "2026-07-28";
const [mode, url, key] = process.argv.slice(2);
if (!["run", "task"].includes(mode) || !url || !key) {
  console.error("usage: node stateless.mjs run|task URL KEY");
  process.exit(2);
}

// seen records what went over HTTP: the protocol version headers sent,
// the methods, and any session id the server answered with.
const seen = { versions: new Set(), methods: [], sessionIds: [] };
const recordingFetch = async (input, init) => {
  const h = new Headers(init?.headers);
  if (h.get("mcp-protocol-version")) seen.versions.add(h.get("mcp-protocol-version"));
  try {
    const m = JSON.parse(init?.body ?? "null")?.method;
    if (m) seen.methods.push(m);
  } catch {}
  const res = await fetch(input, init);
  if (res.headers.get("mcp-session-id")) seen.sessionIds.push(res.headers.get("mcp-session-id"));
  return res;
};

const clientInfo = { name: "stockade-node-stateless", version: "1.0.0" };
const client = new Client(clientInfo, { versionNegotiation: { mode: { pin: VERSION } } });
await client.connect(new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
  fetch: recordingFetch,
}));
const out = { negotiated: client.getNegotiatedProtocolVersion() };

if (mode === "run") {
  const { tools } = await client.listTools();
  out.tools = tools.map((t) => t.name);
  const r = await client.callTool({ name: "run_code", arguments: { language: "python", code: "print(6*7)" } });
  out.text = r.content.filter((c) => c.type === "text").map((c) => c.text);
  out.structured = r.structuredContent;
  out.isError = r.isError ?? false;
} else {
  let id = 0;
  const rawDispatch = async (request, options) => {
    const body = { jsonrpc: "2.0", id: `raw-${++id}`, ...request };
    seen.methods.push(body.method);
    const p = body.params ?? {};
    const res = await fetch(url, {
      method: "POST",
      signal: options?.signal,
      headers: {
        Authorization: `Bearer ${key}`,
        "Content-Type": "application/json",
        Accept: "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": body.method,
        ...(p.name ?? p.taskId ? { "Mcp-Name": p.name ?? p.taskId } : {}),
      },
      body: JSON.stringify(body),
    });
    seen.versions.add(VERSION);
    if (res.headers.get("mcp-session-id")) seen.sessionIds.push(res.headers.get("mcp-session-id"));
    const text = await res.text();
    let msg;
    if ((res.headers.get("content-type") ?? "").includes("text/event-stream")) {
      for (const line of text.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const m = JSON.parse(line.slice(5));
        if (m.id === body.id) msg = m;
      }
    } else if (text) {
      msg = JSON.parse(text);
    }
    if (!msg) throw new Error(`no answer to ${body.method} (HTTP ${res.status}): ${text}`);
    // Tell the test what each poll saw: it approves once one saw the
    // task working.
    if (body.method === "tasks/get") console.error(`tasks/get ${msg.result?.status ?? "error"}`);
    return msg.error ? { kind: "error", error: msg.error } : { kind: "result", result: msg.result };
  };
  const session = createTaskSessionFromClient(client, {
    endpointId: "stockade-test",
    rawDispatch,
    v2RequestFraming: { protocolVersion: VERSION, clientInfo, clientCapabilities: {} },
  });
  try {
    const execution = await session.callTool("run_code", { language: "python", code: "print(6*7)" });
    out.kind = execution.kind;
    out.taskId = execution.handle?.taskId;
    console.error(`task ${out.taskId}`);
    const statuses = [];
    const { outcome } = await execution.settle({
      onEvent: (e) => { if (e.type === "task") statuses.push(e.task.status); },
    });
    out.statuses = statuses;
    out.outcome = outcome.status;
    const r = resultFromTaskOutcome(outcome);
    out.text = r.content.filter((c) => c.type === "text").map((c) => c.text);
    out.structured = r.structuredContent;
    out.isError = r.isError ?? false;
  } finally {
    await session.close();
  }
}
out.versions = [...seen.versions];
out.methods = seen.methods;
out.sessionIds = seen.sessionIds;
console.log(JSON.stringify(out));
await client.close();
