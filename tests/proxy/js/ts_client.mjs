// The official TypeScript client (@modelcontextprotocol/sdk) driving a server over stdio.
// argv: NODE_MODULES_DIR TOOL ARGS_JSON REPEAT -- COMMAND [ARGS...]
// Prints one JSON line per call: {"ok": true, "result": ...} or {"ok": false, "error": ...}.
import { createRequire } from "node:module";
import path from "node:path";

const [modules, tool, argsJson, repeat, sep, command, ...commandArgs] = process.argv.slice(2);
if (sep !== "--") throw new Error("usage: ts_client.mjs MODULES TOOL ARGS REPEAT -- CMD ...");
const require = createRequire(path.join(modules, "noop.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = require("@modelcontextprotocol/sdk/client/stdio.js");

const transport = new StdioClientTransport({ command, args: commandArgs, env: process.env, stderr: "inherit" });
const client = new Client({ name: "ts-client", version: "1.0.0" });
await client.connect(transport);
await client.listTools();
for (let i = 0; i < Number(repeat); i++) {
  try {
    const result = await client.callTool({ name: tool, arguments: JSON.parse(argsJson) });
    console.log(JSON.stringify({ ok: true, result }));
  } catch (error) {
    console.log(JSON.stringify({ ok: false, error: { code: error.code, message: String(error.message) } }));
  }
}
await client.close();
