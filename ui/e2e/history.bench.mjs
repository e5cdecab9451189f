// App benchmark, History at 100k runs (issue 10 item 3): in the real app under WebKitWebDriver, the time
// from opening History to its first rows on screen, then a scroll to the end of 100,000 rows the way a
// mouse wheel and a scrollbar drag do it, with every frame's length measured in the page (requestAnimationFrame).
// Prints one JSON line. The app keeps its users' rendering (no GPU compositing: GANTRY_LIGHT_WEBVIEW=1). Run by scripts/bench-app.sh (GANTRY_APP, GANTRY_STATE_DIR seeded, DISPLAY set).
import assert from "node:assert/strict";
import { By, until } from "selenium-webdriver";
import { openSession, startDriver, stopDriver } from "./driver.mjs";

const app = process.env.GANTRY_APP;
assert.ok(app && process.env.GANTRY_STATE_DIR && process.env.DISPLAY, "needs GANTRY_APP, GANTRY_STATE_DIR and DISPLAY");
const port = Number(process.env.BENCH_PORT ?? 4450);
const driver = await startDriver(port, port + 1, { GANTRY_LIGHT_WEBVIEW: "1", ...process.env, GANTRY_GPUS: process.env.GANTRY_GPUS ?? "sim:8x80GiB" });
let d;
try {
  d = await openSession(port, app);
  await d.wait(until.elementLocated(By.css('[data-testid="gpu-0"]')), 60_000, "the GPUs view never showed");
  await d.sleep(1000);
  const opens = [];
  for (let i = 0; i < 5; i++) {
    // Open History from another tab (each visit builds the view anew, as a click on the tab does).
    await d.executeScript("location.hash = '#/queue'");
    await d.wait(until.elementLocated(By.css('[data-testid="view-queue"]')), 10_000);
    await d.executeScript("performance.clearMarks(); performance.mark('gantry:history-open'); location.hash = '#/history'");
    const ms = await d.wait(() => d.executeScript(`
      const a = performance.getEntriesByName('gantry:history-open')[0], b = performance.getEntriesByName('gantry:history-rows')[0];
      return a && b ? b.startTime - a.startTime : null;`), 10_000, "History never showed its rows");
    opens.push(ms);
  }
  const rows = await d.findElements(By.css('[data-testid^="history-row-"]'));
  assert.ok(rows.length > 10, `History shows only ${rows.length} rows`);
  // Scroll to the end: 40 wheel notches (120 px each, one per frame), then a scrollbar drag to the bottom
  // in 30 steps of one frame each, then a pause for the last page. Frame lengths from rAF timestamps.
  const result = await d.executeAsyncScript(`
    const done = arguments[arguments.length - 1];
    const el = document.querySelector('[data-testid="history-scroll"]');
    const frames = [], slow = [];
    let last = null, step = 0, running = true, tLast = null;
    const end = () => el.scrollHeight - el.clientHeight;
    const wheel = 40, drag = 30;
    const t0 = performance.now();
    function frame(t) {
      if (last !== null) { frames.push(t - last); if (t - last > 40) slow.push([step, Math.round(t - last)]); }
      last = t;
      if (step < wheel) el.scrollTop += 120;
      else if (step < wheel + drag) el.scrollTop = Math.round(end() * (step - wheel + 1) / drag);
      if (step === wheel + drag - 1) tLast = performance.now();
      step++;
      if (running) requestAnimationFrame(frame);
    }
    requestAnimationFrame(frame);
    const check = () => {
      const lastRow = document.querySelector('[data-testid="history-count"]').textContent.replace(/[^0-9]/g, '');
      const shown = [...document.querySelectorAll('[data-testid^="history-row-"]')].length;
      if (step >= wheel + drag && shown > 0 && !document.querySelector('.vt-row.loading')) {
        const settled = performance.now() - tLast;
        setTimeout(() => { running = false; done({ frames, slow, settled, total: Number(lastRow), atEnd: el.scrollTop >= end() - 2 }); }, 300);
      } else setTimeout(check, 10);
    };
    check();`);
  const f = result.frames.slice().sort((a, b) => a - b);
  const pct = (p) => f[Math.min(f.length - 1, Math.ceil((f.length * p) / 100) - 1)];
  opens.sort((a, b) => a - b);
  console.log(JSON.stringify({
    runs: result.total, open_ms: opens, open_median_ms: opens[2], open_max_ms: opens[4], at_end: result.atEnd,
    scroll_frames: f.length, frame_p50_ms: pct(50), frame_p95_ms: pct(95), frame_max_ms: f[f.length - 1],
    frames_over_50ms: f.filter((x) => x > 50).length, slow_frames_at_step: result.slow, scroll_settled_ms: result.settled,
  }));
} finally {
  try { await d?.quit(); } catch {}
  await stopDriver(driver);
}
