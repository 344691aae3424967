// Drive a WebSocket test app (tests/apps/ws_fastapi.py, ws_channels.py) with Node's `ws` client and
// print ONE JSON summary (tests/test_websocket_clients.py checks it).
//
//     node tests/clients/ws_node.js http://127.0.0.1:8000 [N]
//
// `ws` comes from npm (tests/clients/package.json, installed into tests/clients/node_modules by the
// test). What it does:
// - echo: N (1,000) text messages (non-ASCII among them) sent at once, then N/10 binary ones and a
//   256 KB compressible binary one, every echo checked in order;
// - permessage-deflate: offered (ws's default); the summary has the Sec-WebSocket-Extensions header
//   of the 101 response and what ws negotiated;
// - closes: the app closes with 4000 "node bye" (the code and reason ws reports), the client closes
//   with 4002 "node client bye" (what the app's websocket.disconnect said, read over HTTP /closes);
// - /ws/deny: the HTTP status of the refused upgrade;
// - pings: how many of the server's keep-alive pings ws saw (and answered: ws does) on the echo
//   connection; it waits up to 10 s for one (run the server with a short --ws-ping-interval).
"use strict";

const path = require("path");
const WebSocket = require(path.join(__dirname, "node_modules", "ws"));

const base = (process.argv[2] || "http://127.0.0.1:8000").replace(/\/$/, "");
const wsBase = "ws" + base.slice("http".length);
const n = Number(process.argv[3] || 1000);
const errors = [];
let pings = 0;

function open(urlPath, options) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(wsBase + urlPath, options || {});
    let upgradeHeaders = null;
    ws.on("upgrade", (res) => { upgradeHeaders = res.headers; });
    ws.once("open", () => resolve({ ws, headers: upgradeHeaders }));
    ws.once("unexpected-response", (req, res) => {
      reject(Object.assign(new Error("unexpected response " + res.statusCode), { status: res.statusCode }));
      req.destroy();
    });
    ws.once("error", reject);
  });
}

function closed(ws) {
  return new Promise((resolve) => ws.once("close", (code, reason) => resolve({ code, reason: reason.toString() })));
}

// Send every message at once and check the echoes in order: resolves with the number matched.
function pipelined(ws, messages) {
  return new Promise((resolve, reject) => {
    let received = 0, matched = 0;
    const onMessage = (data, isBinary) => {
      const want = messages[received++];
      const same = typeof want === "string"
        ? !isBinary && data.toString("utf8") === want
        : isBinary && Buffer.compare(data, want) === 0;
      if (same) matched++; else errors.push("echo #" + (received - 1) + " differs");
      if (received === messages.length) {
        ws.off("message", onMessage);
        resolve(matched);
      }
    };
    ws.on("message", onMessage);
    ws.once("close", () => reject(new Error("closed after " + received + " echoes")));
    for (const m of messages) ws.send(m, { binary: typeof m !== "string" });
  });
}

const UNICODE = ["héllo wörld", "☃ snowman", "🚀 rocket", "中文字符", "עברית"];

async function echo() {
  const { ws, headers } = await open("/ws/echo", { perMessageDeflate: true });
  ws.on("ping", () => { pings++; });
  const result = {
    extensions_header: headers["sec-websocket-extensions"] || null,
    negotiated: ws.extensions,
  };
  const texts = [];
  for (let i = 0; i < n; i++) texts.push("node " + i + " " + UNICODE[i % UNICODE.length] + " " + "y".repeat(i % 64));
  result.text_ok = await pipelined(ws, texts);
  const binaries = [];
  for (let i = 0; i < n / 10; i++) binaries.push(Buffer.from(Array.from({ length: 1 + i % 500 }, (_, j) => (i + j * 13) & 255)));
  binaries.push(Buffer.alloc(256 * 1024, "refork "));
  result.binary_ok = await pipelined(ws, binaries);
  result.binary_sent = binaries.length;
  for (let waited = 0; pings === 0 && waited < 10000; waited += 50) await new Promise((r) => setTimeout(r, 50));
  const done = closed(ws);
  ws.send("close 4000 node bye");
  result.server_close = await done;
  return result;
}

async function clientClose() {
  const tag = "node" + process.pid + "-" + Date.now();
  const { ws } = await open("/ws/echo?tag=" + tag);
  const done = closed(ws);
  ws.close(4002, "node client bye");
  await done;
  const deadline = Date.now() + 10000;
  while (Date.now() < deadline) {
    const res = await fetch(base + "/closes?tag=" + tag);
    if (res.status === 200) return await res.json();
    await new Promise((r) => setTimeout(r, 50));
  }
  errors.push("the app never recorded the client's close");
  return null;
}

async function deny() {
  try {
    const { ws } = await open("/ws/deny");
    ws.terminate();
    errors.push("/ws/deny accepted");
    return { status: 101 };
  } catch (e) {
    return { status: e.status || String(e) };
  }
}

async function main() {
  const summary = { n, ws_version: require(path.join(__dirname, "node_modules", "ws", "package.json")).version };
  for (const [name, step] of [["echo", echo], ["client_close", clientClose], ["deny", deny]]) {
    try {
      summary[name] = await step();
    } catch (e) {
      summary[name] = null;
      errors.push(name + ": " + e);
    }
  }
  summary.pings = pings;
  summary.errors = errors;
  console.log(JSON.stringify(summary));
  process.exit(errors.length ? 1 : 0);
}

setTimeout(() => { errors.push("timed out"); console.log(JSON.stringify({ n, errors })); process.exit(1); }, 60000).unref();
main();
