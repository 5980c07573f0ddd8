// The OpenAI Agents JS SDK's MCP wrapper (MCPServerStreamableHttp) against
// the gateway: connect with a bearer token, list the tools, turn them into
// the function tools an agent hands to the model, and print their names.
// Usage: MCP_URL=… MCP_TOKEN=… node agents-list.mjs
import { MCPServerStreamableHttp, getAllMcpTools } from "@openai/agents";

const server = new MCPServerStreamableHttp({
  url: process.env.MCP_URL,
  name: "xiaoclaw",
  requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}` } },
});
try {
  await server.connect();
  const listed = await server.listTools();
  const functionTools = await getAllMcpTools({ mcpServers: [server], convertSchemasToStrict: false });
  console.log(
    JSON.stringify({
      listed: listed.map((t) => t.name),
      functionTools: functionTools.map((t) => ({ type: t.type, name: t.name })),
    }),
  );
} catch (e) {
  console.log(JSON.stringify({ error: String(e?.stack ?? e) }));
  process.exitCode = 1;
} finally {
  await server.close();
}
