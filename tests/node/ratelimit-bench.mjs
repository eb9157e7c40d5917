// The @upstash/ratelimit side of the REST benchmark (scripts/bench): its
// tokenBucket limiter against FLOODGATE_REST_URL, BENCH_CALLERS concurrent callers,
// BENCH_REQUESTS decisions on random identifiers from a 1,000,000-key space.
// Prints one JSON line: {"rate": decisions/s, "p50_us": .., "p99_us": .., "allowed": ..}.
import { Ratelimit } from "@upstash/ratelimit";
import { Redis } from "@upstash/redis";

const redis = new Redis({
  url: process.env.FLOODGATE_REST_URL,
  token: process.env.FLOODGATE_REST_TOKEN,
  enableTelemetry: false,
});
const limiter = new Ratelimit({
  redis,
  // 1,000 tokens, 1,000 refilled per minute: the same quota as Floodgate's side
  limiter: Ratelimit.tokenBucket(1000, "60 s", 1000),
  prefix: "bench",
  analytics: false,
  ephemeralCache: false, // every decision goes to Redis, as Floodgate's do
});
const callers = Number(process.env.BENCH_CALLERS ?? 50);
const total = Number(process.env.BENCH_REQUESTS ?? 20000);
const per = Math.floor(total / callers);
const latencies = [];
let allowed = 0;

// warm-up, untimed: loads the script (EVALSHA/EVAL fallback), opens connections
// and lets the JIT compile the hot path, as the Rust side warms up too
const warm = Math.min(2000, total);
await Promise.all(
  Array.from({ length: callers }, async (_, c) => {
    for (let i = c; i < warm; i += callers) await limiter.limit(`warm-${i}`);
  }),
);

const start = performance.now();
await Promise.all(
  Array.from({ length: callers }, async () => {
    for (let i = 0; i < per; i++) {
      const id = String(Math.floor(Math.random() * 1_000_000));
      const t = performance.now();
      const r = await limiter.limit(id);
      latencies.push((performance.now() - t) * 1000);
      if (r.success) allowed++;
    }
  }),
);
const seconds = (performance.now() - start) / 1000;
latencies.sort((a, b) => a - b);
const pct = (p) => latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * p))];
console.log(JSON.stringify({ rate: latencies.length / seconds, p50_us: pct(0.5), p99_us: pct(0.99), allowed }));
