// Serves the built Worker (build/) in workerd through Miniflare on a loopback port,
// for the run command and the end-to-end tests. Configuration from the environment:
//   PORT, UPSTREAM_URL, UPSTASH_REDIS_REST_URL, UPSTASH_REDIS_REST_TOKEN,
//   CACHE_TTL_MS (default 5000); and WORKER_VARS, a JSON object of any more of the
//   Worker's variables (deadlines, timeouts, breaker, headers, regions);
//   SCRIPT=passthrough serves passthrough.mjs (no limiter) instead: a baseline.
// Prints "ready <url>" once it accepts requests; SIGTERM/SIGINT stop it.
import { Miniflare } from "miniflare";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const here = dirname(fileURLToPath(import.meta.url));
const need = (name) => {
  const v = process.env[name];
  if (!v) {
    console.error(`serve.mjs: ${name} is not set`);
    process.exit(2);
  }
  return v;
};
// More of the Worker's variables (its settings, LOG_LEVEL, REGION, REGIONAL_*: see
// edge/worker/src/lib.rs), as one JSON object of name to value: WORKER_VARS.
let optional = {};
try {
  optional = JSON.parse(process.env.WORKER_VARS ?? "{}");
} catch (e) {
  console.error(`serve.mjs: WORKER_VARS must be a JSON object: ${e.message}`);
  process.exit(2);
}
const passthrough = process.env.SCRIPT === "passthrough"; // the benchmark's baseline
const mf = new Miniflare({
  modules: true,
  scriptPath: join(here, passthrough ? "passthrough.mjs" : "build/index.js"),
  modulesRules: [{ type: "CompiledWasm", include: ["**/*.wasm"], fallthrough: true }],
  compatibilityDate: "2026-04-01",
  host: "127.0.0.1",
  port: Number(process.env.PORT ?? 8787),
  cf: false,
  bindings: {
    UPSTREAM_URL: need("UPSTREAM_URL"),
    UPSTASH_REDIS_REST_URL: need("UPSTASH_REDIS_REST_URL"),
    UPSTASH_REDIS_REST_TOKEN: need("UPSTASH_REDIS_REST_TOKEN"),
    CACHE_TTL_MS: process.env.CACHE_TTL_MS ?? "5000",
    ...optional,
  },
});
const url = await mf.ready;
console.log(`ready ${url}`);
const stop = async () => {
  await mf.dispose();
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
// Tests hold our stdin open and close it (or die) when done: stop then too, so no
// workerd process outlives them.
if (process.env.STOP_ON_STDIN_EOF === "1") {
  process.stdin.on("end", stop);
  process.stdin.resume();
}
