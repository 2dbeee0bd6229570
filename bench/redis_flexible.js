// rate-limiter-flexible (RateLimiterRedis on ioredis) closed-loop load:
// prints {"ops_per_s", "p50_us", "p99_us"}.
// usage: node redis_flexible.js PORT CONCURRENCY SECONDS
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

async function main() {
  const [port, conc, secs] = [Number(process.argv[2]), Number(process.argv[3]), Number(process.argv[4])];
  const client = new Redis({ port, host: '127.0.0.1', enableOfflineQueue: false });
  await new Promise((ok) => client.once('ready', ok));
  const limiter = new RateLimiterRedis({ storeClient: client, points: 1e6, duration: 1, keyPrefix: 'bench' });
  const lat = [];
  const deadline = performance.now() + secs * 1000;
  async function worker(t) {
    let i = t;
    while (performance.now() < deadline) {
      const start = performance.now();
      await limiter.consume(`k${i % 1000}`, 1);
      lat.push(performance.now() - start);
      i += conc;
    }
  }
  const started = performance.now();
  await Promise.all(Array.from({ length: conc }, (_, t) => worker(t)));
  const elapsed = (performance.now() - started) / 1000;
  lat.sort((a, b) => a - b);
  const pct = (p) => Math.round(lat[Math.min(Math.floor(lat.length * p), lat.length - 1)] * 1000);
  console.log(JSON.stringify({ ops_per_s: Math.round(lat.length / elapsed), p50_us: pct(0.5), p99_us: pct(0.99) }));
  client.disconnect();
}
main().catch((e) => { console.error(e); process.exit(1); });
