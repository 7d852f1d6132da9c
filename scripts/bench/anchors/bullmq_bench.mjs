// BullMQ anchor for the worker's throughput scenario (scripts/bench/anchors.py runs it).
//
//   NODE_PATH=<dir with bullmq in it> node bullmq_bench.mjs REDIS_URL N CONCURRENCY \
//       [payload=BYTES] [retention=off|default]
//
// Enqueues N jobs (Queue.addBulk, 1 000 a call; not timed), each carrying one message-sized
// payload, then starts one Worker (its normal API: concurrency, a no-op processor) and times
// from its start until the N-th 'completed' event (emitted after BullMQ has recorded the
// completion in Redis). CPU: this process's user + system time (getrusage, every thread) and
// Redis's INFO cpu over the same interval. Prints one JSON line.
// retention=off: removeOnComplete: true (BullMQ's default keeps every completed job forever).
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { Queue, Worker } = require('bullmq'); // resolved through NODE_PATH (the cache folder)
const bullmqVersion = require('bullmq/package.json').version;

const [url, nArg, concurrencyArg, ...rest] = process.argv.slice(2);
if (!url || !nArg || !concurrencyArg) {
  console.error('usage: bullmq_bench.mjs REDIS_URL N CONCURRENCY [payload=BYTES] [retention=off|default]');
  process.exit(2);
}
const options = Object.fromEntries(rest.map((arg) => arg.split('=', 2)));
const n = Number(nArg);
const concurrency = Number(concurrencyArg);
const payload = 'x'.repeat(Number(options.payload ?? 435));
const retention = options.retention ?? 'off';

const parsed = new URL(url);
const connection = {
  host: parsed.hostname,
  port: Number(parsed.port || 6379),
  db: Number(parsed.pathname.slice(1) || 0),
  password: parsed.password || undefined,
};
const queueName = 'anchor';
const jobOptions = retention === 'off' ? { removeOnComplete: true } : {};

async function redisCpuSeconds(client) {
  const info = await client.info('cpu');
  const field = (name) => Number(info.match(new RegExp(`^${name}:([0-9.]+)`, 'm'))[1]);
  return field('used_cpu_user') + field('used_cpu_sys');
}

const queue = new Queue(queueName, { connection });
const client = await queue.client;
const enqueueStart = performance.now();
for (let start = 0; start < n; start += 1000) {
  const batch = [];
  for (let i = start; i < Math.min(n, start + 1000); i++) {
    batch.push({ name: 'noop', data: { i, message: payload }, opts: jobOptions });
  }
  await queue.addBulk(batch);
}
const enqueueS = (performance.now() - enqueueStart) / 1000;

let done = 0;
let failed = 0;
let finish;
const allDone = new Promise((resolve) => {
  finish = resolve;
});
const worker = new Worker(queueName, async () => {}, { connection, concurrency, autorun: false });
worker.on('completed', () => {
  done += 1;
  if (done === n) finish(performance.now());
});
worker.on('failed', (job, error) => {
  failed += 1;
  console.error(`job ${job?.id} failed: ${error}`);
  process.exit(1);
});
await worker.waitUntilReady();

const redis0 = await redisCpuSeconds(client);
const cpu0 = process.cpuUsage();
const t0 = performance.now();
worker.run();
const t1 = await allDone;
const cpu1 = process.cpuUsage(cpu0);
const redisS = (await redisCpuSeconds(client)) - redis0;
const wallS = (t1 - t0) / 1000;
const workerS = (cpu1.user + cpu1.system) / 1e6;
const left = await queue.getJobCounts('wait', 'active', 'delayed', 'prioritized');
await worker.close();
await queue.close();

console.log(
  JSON.stringify({
    anchor: 'bullmq',
    versions: { bullmq: bullmqVersion, node: process.versions.node },
    n,
    concurrency,
    retention,
    enqueue_s: enqueueS,
    wall_s: wallS,
    jobs_s: n / wallS,
    worker_cpu: workerS / wallS,
    redis_cpu: redisS / wallS,
    worker_us: (workerS / n) * 1e6,
    redis_us: (redisS / n) * 1e6,
    failed,
    left: Object.values(left).reduce((a, b) => a + b, 0),
  }),
);
