// cells.mjs opens a Stockade session with the TypeScript MCP SDK's client,
// runs two cells that share state (the second draws a figure), closes the
// session, and prints what it got as JSON on stdout.
//
//   node cells.mjs http URL KEY      streamable HTTP, KEY as the bearer token
//   node cells.mjs stdio CMD ARG...  a server started as CMD ARG... (stdio)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [mode, ...args] = process.argv.slice(2);
let transport;
if (mode === "http") {
  const [url, key] = args;
  transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  });
} else if (mode === "stdio") {
  const [command, ...rest] = args;
  transport = new StdioClientTransport({ command, args: rest, stderr: "inherit" });
} else {
  console.error("usage: node cells.mjs http URL KEY | stdio CMD ARG...");
  process.exit(2);
}

const client = new Client({ name: "stockade-node-test", version: "1.0.0" });
await client.connect(transport);
const call = (name, args) => client.callTool({ name, arguments: args });
const created = await call("create_session", { language: "python" });
const id = created.structuredContent?.session_id;
const first = await call("run_cell", { session_id: id, code: "import matplotlib.pyplot as plt\nx = 6*7" });
const second = await call("run_cell", { session_id: id, code: "plt.figure(figsize=(2, 1.5), dpi=100)\nplt.plot([1, 2, 3])\nx" });
const closed = await call("close_session", { session_id: id });
const view = (r) => ({
  isError: r.isError ?? false,
  text: r.content.filter((c) => c.type === "text").map((c) => c.text),
  images: r.content.filter((c) => c.type === "image").map((c) => ({ mimeType: c.mimeType, data: c.data })),
  structured: r.structuredContent,
});
console.log(JSON.stringify({ created: view(created), first: view(first), second: view(second), closed: view(closed) }));
await client.close();
