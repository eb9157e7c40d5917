// The @upstash/ratelimit side of `scripts/bench cost`: BENCH_INSTANCES limiters
// (each with its own client, as separate edge instances would be) sharing the
// load of BENCH_RATE requests/s for BENCH_SECS seconds, open loop, on BENCH_KEYS
// identifiers drawn from Zipf(BENCH_ZIPF), against FLOODGATE_REST_URL, with the
// limiter BENCH_LIMITER (tokenBucket | fixedWindow | slidingWindow) at 60,000/min.
// The caller counts the commands the Redis server ran (INFO commandstats).
// Prints one JSON line: {"requests": n, "allowed": n, "failed": n}.
import { Ratelimit } from "@upstash/ratelimit";
import { Redis } from "@upstash/redis";

const env = process.env;
const instances = Number(env.BENCH_INSTANCES ?? 4);
const rate = Number(env.BENCH_RATE ?? 120);
const secs = Math.min(Number(env.BENCH_SECS ?? 10), 600);
const keys = Number(env.BENCH_KEYS ?? 16);
const s = Number(env.BENCH_ZIPF ?? 1.1);
const algorithms = {
  tokenBucket: () => Ratelimit.tokenBucket(1000, "1 s", 60000),
  fixedWindow: () => Ratelimit.fixedWindow(60000, "60 s"),
  slidingWindow: () => Ratelimit.slidingWindow(60000, "60 s"),
};
const make = algorithms[env.BENCH_LIMITER ?? "tokenBucket"];
if (!make) throw new Error(`unknown BENCH_LIMITER ${env.BENCH_LIMITER}`);

const limiters = Array.from({ length: instances }, () => new Ratelimit({
  redis: new Redis({
    url: env.FLOODGATE_REST_URL,
    token: env.FLOODGATE_REST_TOKEN,
    enableTelemetry: false,
  }),
  limiter: make(),
  prefix: `cost-${env.BENCH_LIMITER}`,
  analytics: false,
  // the default: an in-memory cache of identifiers already over their limit
  // (none are here, so every decision goes to Redis)
}));

// Zipf(s) over `keys` identifiers, drawn by a seeded generator
const cdf = [];
let sum = 0;
for (let k = 1; k <= keys; k++) { sum += 1 / k ** s; cdf.push(sum); }
let seed = 42;
const random = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };
const draw = () => { const u = random() * sum; return cdf.findIndex((c) => c >= u); };

const total = Math.round(rate * secs);
const start = performance.now();
let sent = 0, allowed = 0, failed = 0;
const pending = [];
while (sent < total && performance.now() - start < (secs * 3 + 1) * 1000) {
  const due = Math.min(total, Math.floor(((performance.now() - start) / 1000) * rate) + 1);
  while (sent < due) {
    const limiter = limiters[sent % instances];
    pending.push(limiter.limit(`user-${draw()}`).then(
      (r) => { if (r.success) allowed++; },
      () => { failed++; },
    ));
    sent++;
  }
  await new Promise((r) => setTimeout(r, 1));
}
await Promise.all(pending);
console.log(JSON.stringify({ requests: sent, allowed, failed }));
