// The official @upstash/redis client, in its DEFAULT settings (base64 responses),
// drives floodgate-rest. Run by tests/tests/rest_conformance.rs, which starts Redis
// and the endpoint and passes FLOODGATE_REST_URL / FLOODGATE_REST_TOKEN /
// FLOODGATE_SCRIPT (the token-bucket Lua source file).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Redis } from "@upstash/redis";

const url = process.env.FLOODGATE_REST_URL;
const token = process.env.FLOODGATE_REST_TOKEN;
const redis = new Redis({ url, token, enableTelemetry: false });
const key = (name) => `conf:${name}:${process.pid}:${Math.random().toString(36).slice(2)}`;

test("set and get, including unicode and JSON values", async () => {
  const k = key("kv");
  assert.equal(await redis.set(k, "bar"), "OK");
  assert.equal(await redis.get(k), "bar");
  await redis.set(k, "héllo ✓ 🚦");
  assert.equal(await redis.get(k), "héllo ✓ 🚦");
  await redis.set(k, { a: 1, b: [2, 3] });
  assert.deepEqual(await redis.get(k), { a: 1, b: [2, 3] });
  assert.equal(await redis.get(key("missing")), null);
  assert.equal(await redis.incrby(key("n"), 5), 5);
  assert.equal(await redis.ping(), "PONG");
});

test("pipeline: several commands, one round trip, errors per command", async () => {
  const k = key("pipe");
  const p = redis.pipeline();
  p.set(k, "1");
  p.incr(k);
  p.get(k);
  assert.deepEqual(await p.exec(), ["OK", 2, 2]);
  const bad = redis.pipeline();
  bad.set(k, "x");
  bad.lpush(k, "y");
  await assert.rejects(bad.exec(), /WRONGTYPE/);
  const kept = redis.pipeline();
  kept.get(k);
  kept.lpush(k, "y");
  const res = await kept.exec({ keepErrors: true });
  assert.equal(res[0].result, "x");
  assert.match(res[1].error, /WRONGTYPE/);
});

test("multi-exec is atomic and returns every result", async () => {
  const k = key("tx");
  const tx = redis.multi();
  tx.set(k, "10");
  tx.incrby(k, 5);
  tx.get(k);
  assert.deepEqual(await tx.exec(), ["OK", 15, 15]);
});

test("EVALSHA falls back to EVAL after SCRIPT FLUSH (the token-bucket script)", async () => {
  const source = readFileSync(process.env.FLOODGATE_SCRIPT, "utf8");
  const script = redis.createScript(source);
  await redis.scriptFlush();
  const k = `fg:{conf:${process.pid}}:bucket`;
  // burst 3 tokens of 1 s each, cost 1 token: three admitted, the fourth denied
  const results = [];
  for (let i = 0; i < 4; i++) results.push(await script.exec([k], ["", "3000000", "1000000"]));
  assert.deepEqual(results.map((r) => r[0]), [1, 1, 1, 0]);
  assert.ok(results.every((r) => r.length === 3 && Number.isInteger(r[1])));
  const [exists] = await redis.scriptExists(await sha1(source));
  assert.equal(exists, 1, "EVAL cached the script");
});

test("errors: Redis' own message; a bad token is refused", async () => {
  const k = key("err");
  await redis.set(k, "v");
  await assert.rejects(redis.lpush(k, "x"), /WRONGTYPE Operation against a key holding the wrong kind of value/);
  await assert.rejects(redis.eval("return redis.call('NOPE')", [], []), /Unknown Redis command called from script|ERR/);
  const intruder = new Redis({ url, token: "wrong-token", enableTelemetry: false, retry: false });
  await assert.rejects(intruder.get(k), /Unauthorized/);
  const anonymous = new Redis({ url, token: "", enableTelemetry: false, retry: false });
  await assert.rejects(anonymous.get(k));
});

async function sha1(text) {
  const digest = await crypto.subtle.digest("SHA-1", new TextEncoder().encode(text));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}
