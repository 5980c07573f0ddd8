// A real MCP client (the official TypeScript SDK) that the interop tests
// drive line by line: each stdin line is a JSON command, each stdout line
// a JSON answer or event. Usage:
//   node sdk-driver.mjs http  (MCP_URL, MCP_TOKEN: StreamableHTTPClientTransport)
//   node sdk-driver.mjs stdio (MCP_COMMAND, MCP_ARGS as a JSON array: StdioClientTransport)
// Commands: {"op":"list"} lists every page; {"op":"call","name":…,"arguments":…};
// {"op":"close"}. Events: {"event":"list_changed"} on notifications/tools/list_changed.
import readline from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const emit = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

const mode = process.argv[2];
let transport;
if (mode === "http") {
  transport = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}` } },
  });
} else if (mode === "stdio") {
  transport = new StdioClientTransport({
    command: process.env.MCP_COMMAND,
    args: JSON.parse(process.env.MCP_ARGS || "[]"),
    env: { ...process.env },
    stderr: "inherit",
  });
} else {
  console.error("usage: sdk-driver.mjs http|stdio");
  process.exit(2);
}

const client = new Client({ name: "interop-ts-sdk", version: "1.0.0" });
client.setNotificationHandler(ToolListChangedNotificationSchema, () => emit({ event: "list_changed" }));
try {
  await client.connect(transport);
} catch (e) {
  emit({ error: String(e?.message ?? e), code: e?.code });
  process.exit(1);
}
emit({
  ready: true,
  sessionId: transport.sessionId ?? null,
  server: client.getServerVersion(),
  capabilities: client.getServerCapabilities(),
});

async function listAll() {
  const tools = [];
  let cursor;
  let pages = 0;
  do {
    const res = await client.listTools(cursor ? { cursor } : undefined);
    pages++;
    tools.push(...res.tools);
    cursor = res.nextCursor;
  } while (cursor);
  return { tools, pages };
}

const rl = readline.createInterface({ input: process.stdin });
// One command at a time, in order.
let queue = Promise.resolve();
rl.on("line", (line) => {
  queue = queue.then(async () => {
    let cmd;
    try {
      cmd = JSON.parse(line);
    } catch {
      emit({ error: "bad command" });
      return;
    }
    try {
      switch (cmd.op) {
        case "list":
          emit(await listAll());
          break;
        case "call":
          emit({ result: await client.callTool({ name: cmd.name, arguments: cmd.arguments ?? {} }) });
          break;
        case "close":
          await client.close();
          emit({ closed: true });
          process.exit(0);
        default:
          emit({ error: `unknown op ${cmd.op}` });
      }
    } catch (e) {
      emit({ error: String(e?.message ?? e), code: e?.code });
    }
  });
});
rl.on("close", async () => {
  await queue;
  await client.close();
  process.exit(0);
});
