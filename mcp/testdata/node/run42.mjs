// run42.mjs calls Stockade's run_code tool with the TypeScript MCP SDK's
// client and prints the result as JSON on stdout.
//
//   node run42.mjs http URL KEY      streamable HTTP, KEY as the bearer token
//   node run42.mjs stdio CMD ARG...  a server started as CMD ARG... (stdio)
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
  console.error("usage: node run42.mjs http URL KEY | stdio CMD ARG...");
  process.exit(2);
}

const client = new Client({ name: "stockade-node-test", version: "1.0.0" });
await client.connect(transport);
const { tools } = await client.listTools();
const progress = [];
const result = await client.callTool(
  { name: "run_code", arguments: { language: "python", code: "print(6*7)" } },
  undefined,
  { onprogress: (p) => progress.push(p.message) },
);
console.log(JSON.stringify({
  tools: tools.map((t) => t.name),
  text: result.content.filter((c) => c.type === "text").map((c) => c.text),
  structured: result.structuredContent,
  isError: result.isError ?? false,
  progress,
}));
await client.close();
