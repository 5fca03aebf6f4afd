/**
 * Preloaded into a process (`node --import <this file's URL> main.js`) to stall its event loop the
 * way heavy load did in the incident: CPU-bound stretches of `EVENT_LOOP_STALL_MS` (default 250) in
 * the process itself, started by incoming HTTP requests, at least `EVENT_LOOP_STALL_GAP_MS`
 * (default 50) apart so that the requests queued meanwhile get in: under steady load, one stall
 * every `stall + gap` ms. Started by requests rather than by a clock, so that every burst meets one
 * right after its Redis calls were sent, whatever its phase against a timer. On SIGTERM it writes
 * one line to stdout, `STALLS {"stallsMs":[...],"loopDelay":{...}}`: every stall as timed, and the
 * event loop's delay as `monitorEventLoopDelay` saw it, which shows the loop really was blocked.
 *
 * Plain JavaScript so that node preloads it without a build step.
 */
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';

const stallMs = Number(process.env.EVENT_LOOP_STALL_MS ?? 250);
const gapMs = Number(process.env.EVENT_LOOP_STALL_GAP_MS ?? 50);

const stallsMs = [];
let pending = false;
let lastEndedAt = Number.NEGATIVE_INFINITY;
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();

function stall() {
  const started = performance.now();
  const until = started + stallMs;
  while (performance.now() < until) {
    // Busy: nothing else in this process runs until the stall is over.
  }
  lastEndedAt = performance.now();
  stallsMs.push(Math.round(lastEndedAt - started));
  pending = false;
}

// The stall runs in the check phase (setImmediate), right after the poll phase that read this
// request: the Redis calls sent while handling the requests of that poll are answered within
// microseconds, but the replies are read only in the next poll, after the stall and after the timers
// that fall due meanwhile, as after a long synchronous stretch under load. A stall in a timer
// callback would not do: Node runs the timers of one turn against the time read before them, so
// deadlines that fall due during such a stall wait until after the next poll has read the replies
// (measured: with a 250 ms busy-wait every 300 ms in a setInterval, the unfixed deadline never fired).
function onRequest() {
  if (pending || performance.now() - lastEndedAt < gapMs) return;
  pending = true;
  setImmediate(stall).unref();
}

subscribe('http.server.request.start', onRequest);

// `once`: Nest's own SIGTERM handler shuts the app down and then re-raises the signal, which must
// then find no listener here, or the process would never end.
process.once('SIGTERM', () => {
  unsubscribe('http.server.request.start', onRequest);
  loopDelay.disable();
  const ms = (ns) => Math.round(ns / 1e6);
  const report = {
    stallMs,
    gapMs,
    stallsMs,
    loopDelay: {
      p50Ms: ms(loopDelay.percentile(50)),
      p99Ms: ms(loopDelay.percentile(99)),
      maxMs: ms(loopDelay.max),
    },
  };
  // Synchronous on a pipe on Linux, so the line is out before the process ends.
  process.stdout.write(`STALLS ${JSON.stringify(report)}\n`);
});
