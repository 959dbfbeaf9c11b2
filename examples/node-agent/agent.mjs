// An fsm-celery agent in plain Node.js (20+, no packages): it speaks docs/protocol.md over Redis
// streams, answers state_tasks, corrects answers the engine refused (state_ack_refused), drops
// cancelled attempts (state_cancel) and reports itself (agent_status).
//
//   FSM_REDIS_URL=redis://user:pass@127.0.0.1:6379/0 FSM_CHANNEL_PREFIX= \
//   node examples/node-agent/agent.mjs AGENT_TYPE [AGENT_ID]
//
// Its answers come from ANSWERS below (by state); write your own in `answer`. With
// FIRST_ANSWER_WRONG=1 its first answer of each attempt gives every boolean as a string
// (passed: "true"), as an LLM might, to show the correction round trip. Redis over TLS
// (rediss://) is not spoken here: that needs node:tls in place of node:net.

import net from "node:net";
import os from "node:os";
import { randomUUID } from "node:crypto";

const GROUP = "agents";
const ANSWERS = {
  RUN_TESTS: { passed: true, coverage: 87 },
  CHECK: { passed: true, score: 7 },
  ANALYZE_BUG: { reproduced: true },
  LOCATE_CODE: { location: "src/routes/health.ts:12" },
  WRITE_FIX: { filesChanged: ["src/routes/health.ts"] },
  COMMIT_PUSH: { commitHash: "3f9c2ab" },
  DEPLOY: { deploymentUrl: "https://example.test" },
};

// The work of one attempt: the output to send. `problems` are why the last answer was refused.
function answer(task, problems) {
  const output = { ...(ANSWERS[task.state] ?? {}) };
  if (process.env.FIRST_ANSWER_WRONG === "1" && problems.length === 0) {
    for (const [key, value] of Object.entries(output)) {
      if (typeof value === "boolean") output[key] = String(value);
    }
  }
  return output;
}

// ---- a minimal Redis client (RESP2): one command at a time per connection ----------------

class Redis {
  constructor(url) {
    const u = new URL(url);
    this.options = { host: u.hostname || "127.0.0.1", port: Number(u.port || 6379) };
    this.auth = u.password ? [decodeURIComponent(u.username || "default"), decodeURIComponent(u.password)] : null;
    this.db = u.pathname.length > 1 ? u.pathname.slice(1) : null;
    this.buffer = Buffer.alloc(0);
    this.waiting = [];
  }

  async connect() {
    this.socket = net.createConnection(this.options);
    await new Promise((resolve, reject) => {
      this.socket.once("connect", resolve);
      this.socket.once("error", reject);
    });
    this.socket.on("data", (chunk) => this.#received(chunk));
    this.socket.on("error", (error) => this.#failAll(error));
    this.socket.on("close", () => this.#failAll(new Error("connection closed")));
    if (this.auth) await this.call("AUTH", ...this.auth);
    // a connection starts in database 0: an agent's credentials there may not run SELECT
    if (this.db && Number(this.db) !== 0) await this.call("SELECT", this.db);
    return this;
  }

  call(...args) {
    const parts = args.map((a) => Buffer.from(String(a)));
    const head = `*${parts.length}\r\n`;
    const body = parts.map((p) => Buffer.concat([Buffer.from(`$${p.length}\r\n`), p, Buffer.from("\r\n")]));
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      this.socket.write(Buffer.concat([Buffer.from(head), ...body]));
    });
  }

  close() {
    this.socket.end();
  }

  #failAll(error) {
    for (const { reject } of this.waiting.splice(0)) reject(error);
  }

  #received(chunk) {
    this.buffer = Buffer.concat([this.buffer, chunk]);
    for (;;) {
      const parsed = parse(this.buffer, 0);
      if (parsed === null) return; // incomplete: wait for more
      this.buffer = this.buffer.subarray(parsed.end);
      const { resolve, reject } = this.waiting.shift();
      if (parsed.value instanceof Error) reject(parsed.value);
      else resolve(parsed.value);
    }
  }
}

// One RESP value from buf at start: { value, end }, or null when buf does not hold it all yet.
function parse(buf, start) {
  const eol = buf.indexOf("\r\n", start);
  if (eol < 0) return null;
  const kind = String.fromCharCode(buf[start]);
  const line = buf.toString("utf8", start + 1, eol);
  const next = eol + 2;
  if (kind === "+") return { value: line, end: next };
  if (kind === "-") return { value: new Error(line), end: next };
  if (kind === ":") return { value: Number(line), end: next };
  if (kind === "$") {
    const size = Number(line);
    if (size < 0) return { value: null, end: next };
    if (buf.length < next + size + 2) return null;
    return { value: buf.toString("utf8", next, next + size), end: next + size + 2 };
  }
  if (kind === "*") {
    const count = Number(line);
    if (count < 0) return { value: null, end: next };
    const items = [];
    let at = next;
    for (let i = 0; i < count; i++) {
      const item = parse(buf, at);
      if (item === null) return null;
      items.push(item.value);
      at = item.end;
    }
    return { value: items, end: at };
  }
  throw new Error(`unexpected RESP type ${kind}`);
}

// ---- the agent ---------------------------------------------------------------------------

const [agentType, givenId] = process.argv.slice(2);
if (!agentType) {
  console.error("usage: node agent.mjs AGENT_TYPE [AGENT_ID]");
  process.exit(2);
}
const agentId = givenId ?? randomUUID();
const prefix = process.env.FSM_CHANNEL_PREFIX ?? "";
const url = process.env.FSM_REDIS_URL ?? "redis://127.0.0.1:6379/0";
const taskStreams = [`${prefix}stream:agent:${agentId}`, `${prefix}stream:agent:${agentType}`];
const ackStream = `${prefix}stream:state:ack:${agentId}`;
const held = new Map(); // `${machineId}:${attempt}` -> the state_task, answered or being answered
const cancelled = new Set();
let running = true;

const reader = await new Redis(url).connect(); // blocks in XREADGROUP
const writer = await new Redis(url).connect(); // sends answers meanwhile

const send = (message) => writer.call("XADD", ackStream, "MAXLEN", "~", "10000", "*", "message", JSON.stringify(message));
const done = async (stream, id) => {
  await writer.call("XACK", stream, GROUP, id);
  await writer.call("XDEL", stream, id);
};
const status = (state) =>
  send({ type: "agent_status", agentId, agentType, status: state, concurrency: 1, running: 0, hostname: os.hostname() });

// An answer checked before it goes: requiredOutput's keys (a full JSON Schema check of
// outputSchema needs a validator package; the engine checks it and refuses what breaks it).
function missing(task, output) {
  return (task.requiredOutput ?? []).filter((key) => !(key in output)).map((key) => ({ pointer: "", message: `'${key}' is a required property` }));
}

async function work(task, problems) {
  let output = answer(task, problems);
  const local = missing(task, output);
  if (local.length > 0) output = answer(task, local);
  if (cancelled.has(`${task.machineId}:${task.attempt}`)) return;
  const { machineId, state, attempt, taskToken } = task;
  await send({ type: "state_ack", machineId, state, attempt, taskToken, success: true, output });
}

async function handle(stream, id, message) {
  const key = `${message.machineId}:${message.attempt}`;
  if (message.type === "state_cancel") {
    cancelled.add(key);
  } else if (message.type === "state_ack_refused") {
    const task = held.get(key);
    if (task && task.taskToken === message.taskToken && new Date(task.deadline) > new Date()) {
      console.log(`refused ${key} (${message.correctionsLeft} left): ${JSON.stringify(message.problems)}`);
      await work(task, message.problems);
    }
  } else if (new Date(message.deadline) > new Date() && !cancelled.has(key)) {
    held.set(key, message);
    if (held.size > 256) held.delete(held.keys().next().value);
    await work(message, []);
  }
  await done(stream, id);
}

for (const stream of taskStreams) {
  try {
    await writer.call("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM");
  } catch (error) {
    if (!String(error.message).startsWith("BUSYGROUP")) throw error;
  }
}
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => (running = false));
await status("active");
const beat = setInterval(() => status("active").catch(() => {}), 5000);
console.log(`agent ${agentId} (${agentType}) reading ${taskStreams.join(", ")}`);

while (running) {
  const found = await reader.call("XREADGROUP", "GROUP", GROUP, agentId, "COUNT", "10", "BLOCK", "1000", "STREAMS", ...taskStreams, ">", ">");
  for (const [stream, entries] of found ?? []) {
    for (const [id, fields] of entries) {
      const at = fields.indexOf("message");
      if (at < 0) continue;
      try {
        await handle(stream, id, JSON.parse(fields[at + 1]));
      } catch (error) {
        console.error(`entry ${id} on ${stream}: ${error.message}`);
      }
    }
  }
}
clearInterval(beat);
await status("stopped");
reader.close();
writer.close();
