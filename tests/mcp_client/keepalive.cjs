// The official TypeScript MCP SDK (the client most MCP hosts embed) over
// streamable HTTP, on one keep-alive connection: N calls of a tool, each
// timed. Prints one JSON line {p25, p50, min, max} in milliseconds.
//
// usage: node keepalive.cjs PREFIX URL TOKEN TOOL N
//   PREFIX: a directory whose node_modules holds @modelcontextprotocol/sdk
const { createRequire } = require("node:module");
const path = require("node:path");

const [prefix, url, token, tool, count] = process.argv.slice(2);
const sdk = createRequire(path.join(prefix, "package.json"));
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = sdk("@modelcontextprotocol/sdk/client/streamableHttp.js");

async function main() {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: "keepalive", version: "0" });
  await client.connect(transport);
  const n = Number(count);
  const times = [];
  for (let i = 0; i < n; i++) {
    const start = process.hrtime.bigint();
    const result = await client.callTool({ name: tool, arguments: {} });
    times.push(Number(process.hrtime.bigint() - start) / 1e6);
    if (result.isError) throw new Error(`${tool} answered an error: ${JSON.stringify(result)}`);
  }
  times.sort((a, b) => a - b);
  const at = (q) => times[Math.floor(n * q)];
  console.log(JSON.stringify({ p25: at(0.25), p50: at(0.5), min: times[0], max: times[n - 1] }));
  await client.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
