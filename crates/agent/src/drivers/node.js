// The persistent Node.js interpreter behind sandbox_run_code. Requests on fd 3, responses on fd 4
// (one JSON object per line); the cell's output goes to the real stdout and stderr, which the agent
// captures. Top-level `var`, `let`, `const` and functions persist across calls, as in the REPL.
"use strict";
const fs = require("fs");
const readline = require("readline");
const util = require("util");
const vm = require("vm");

// SIGINT interrupts a running cell (breakOnSigint); between cells it must not end the session.
process.on("SIGINT", () => {});
process.on("uncaughtException", (e) => process.stderr.write(`Uncaught ${e && e.stack || e}\n`));
process.on("unhandledRejection", (e) => process.stderr.write(`Unhandled rejection: ${e && e.stack || e}\n`));

const lines = readline.createInterface({ input: fs.createReadStream(null, { fd: 3 }), crlfDelay: Infinity });
const queue = [];
let busy = false;

async function execute(code) {
  let value = vm.runInThisContext(code, { filename: "<cell>", breakOnSigint: true });
  if (value && typeof value.then === "function") value = await value;
  if (value === undefined) return null;
  globalThis._ = value;
  const text = util.inspect(value, { depth: 4, maxArrayLength: 100, maxStringLength: 10000, breakLength: 120 });
  return text.length <= 65536 ? text : text.slice(0, 65536) + "…";
}

async function drain() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    const request = JSON.parse(queue.shift());
    let response;
    try {
      response = { ok: true, result: await execute(request.code) };
    } catch (e) {
      const err = e instanceof Error ? e : new Error(String(e));
      response = { ok: false, error: { name: err.name || "Error", message: err.message, traceback: err.stack || String(e) } };
    }
    fs.writeSync(4, JSON.stringify(response) + "\n");
  }
  busy = false;
}

lines.on("line", (line) => { queue.push(line); drain(); });
lines.on("close", () => process.exit(0));
