// End-to-end: the real Gantry app binary (embedded engine, simulated GPUs, real Docker) driven through
// tauri-driver + WebKitWebDriver. Needs DISPLAY (Xvfb), Docker and the gantry-test/busybox:1 image.
// Run with scripts/e2e.sh, which sets all of that up.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { By, until } from "selenium-webdriver";
import { openSession, startDriver, stopDriver } from "./driver.mjs";

const repo = path.resolve(import.meta.dirname, "../..");
const app = process.env.GANTRY_APP ?? path.join(repo, "target/debug/gantry-app");
const shots = process.env.GANTRY_SHOTS ?? path.join(repo, "target/e2e-shots");
const work = fs.mkdtempSync(path.join(os.tmpdir(), "gantry-e2e-"));
let driverProc;
let d;

assert.ok(process.env.DISPLAY, "DISPLAY must be set (run under Xvfb): without it the app aborts in GTK init");

async function shot(name) {
  fs.mkdirSync(shots, { recursive: true });
  fs.writeFileSync(path.join(shots, `${name}.png`), await d.takeScreenshot(), "base64");
}

const byTest = (id) => By.css(`[data-testid="${id}"]`);
const waitFor = (id, ms = 30_000) => d.wait(until.elementLocated(byTest(id)), ms, `no element ${id}`);

async function waitText(id, pred, ms = 60_000) {
  let last = "";
  await d.wait(async () => {
    try { last = await (await d.findElement(byTest(id))).getText(); } catch { return false; }
    return pred(last);
  }, ms, `${id} never matched; last text: ${last}`);
  return last;
}

before(async () => {
  fs.mkdirSync(path.join(work, "state"));
  driverProc = await startDriver(4444, 4445, { ...process.env, GANTRY_STATE_DIR: path.join(work, "state"), GANTRY_GPUS: "sim:4x24GiB" });
  d = await openSession(4444, app);
});

after(async () => {
  // Only this app's containers: other engines on the machine keep theirs.
  const st = spawnSync(path.join(repo, "target/debug/gantry"), ["--state-dir", path.join(work, "state"), "--json", "status"], { encoding: "utf8" });
  const engineId = st.status === 0 ? JSON.parse(st.stdout).engine_id : null;
  const t0 = Date.now();
  try { await d?.quit(); } catch {}
  console.log(`session closed in ${Date.now() - t0} ms`);
  await stopDriver(driverProc);
  if (engineId) spawnSync("sh", ["-c", `ids=$(docker ps -aq --filter label=dev.gantry.engine=${engineId}); [ -z "$ids" ] || docker rm -f $ids >/dev/null`]);
});

test("submit through the app, watch it run, find it in History and read its log", async () => {
  // The header says which engine this is: the app's own, on the simulated GPUs it was given.
  assert.equal(await (await waitFor("engine")).getText(), "Engine in this app (simulated GPUs 4x24GiB)");
  // GPUs view: simulated, clearly labeled; one card per GPU.
  const banner = await (await waitFor("sim-banner")).getText();
  assert.match(banner, /^Simulated GPUs \(as configured\)\./); // asked for with GANTRY_GPUS: no "driver missing" claim
  await waitFor("gpu-3");
  await shot("1-gpus");

  // Two specs through the drop path: a blocker that takes all 4 GPUs, then our job.
  const blocker = path.join(work, "blocker.yaml");
  const job = path.join(work, "hello.yaml");
  // Long enough to read the GPU cards while it runs, before our job starts.
  fs.writeFileSync(blocker, "name: blocker\nimage: gantry-test/busybox:1\ncommand: sleep 10\ngpus: 4\n");
  fs.writeFileSync(job, "name: hello-e2e\nimage: gantry-test/busybox:1\ncommand: 'echo hello-from-the-container; sleep 2; echo done'\ngpus: 1\n");
  const bad = path.join(work, "broken.yaml");
  fs.writeFileSync(bad, "image: gantry-test/busybox:1\ngpu: 1\n");
  await d.executeScript("return window.__gantryDrop(arguments[0])", [blocker, job, bad]);
  await d.wait(async () => (await d.findElements(byTest("preview-ok"))).length === 2, 20_000, "two previews");
  const err = await (await waitFor("preview-error")).getText();
  assert.match(err, /line 2, column 1: unknown field `gpu`/);
  await shot("2-submit-preview");
  await (await d.findElement(byTest("submit-confirm"))).click();
  await d.wait(async () => (await d.findElements(byTest("submitted-job"))).length === 2, 20_000, "two submitted");
  const links = await d.findElements(byTest("submitted-job"));
  const ids = await Promise.all(links.map((l) => l.getAttribute("data-job")));
  const [blockerId, jobId] = ids.map(Number);

  // Queue: our job waits, and says why.
  await (await d.findElement(byTest("tab-queue"))).click();
  // The queue re-renders on every job event: read rows afresh, retrying a read that raced a re-render.
  const rowOf = async (id) => {
    for (;;) {
      try {
        const r = await waitFor(`queue-row-${id}`);
        return { state: await r.getAttribute("data-state"), text: await r.getText() };
      } catch (e) {
        if (e.name !== "StaleElementReferenceError") throw e;
      }
    }
  };
  // The reason comes with the engine's next scheduling pass ("about to be scheduled" until then).
  let mine;
  await d.wait(async () => /needs 1 free GPU/.test((mine = await rowOf(jobId)).text), 20_000).catch(() => assert.fail(`row: ${mine?.text}`));
  assert.equal(mine.state, "queued");
  await d.wait(async () => (await rowOf(blockerId)).state === "running", 30_000);
  await shot("3-queue");

  // GPU cards: each says who holds it, and since when, while the blocker runs.
  const me = await (await d.findElement(byTest("me"))).getText();
  await d.executeScript(`location.hash = "#/gpus"`);
  const held = await waitText("gpu-holders-0", (t) => t.includes(`job ${blockerId} blocker (${me})`), 20_000);
  assert.match(held, /since \d\d:\d\d/);
  assert.match(await (await d.findElement(byTest("gpu-0"))).getText(), /Held by/);
  await shot("3b-gpus-held");

  // Run page: queued -> running -> succeeded, live log.
  await d.executeScript(`location.hash = "#/run/${jobId}"`);
  const seen = new Set();
  await d.wait(async () => {
    try { seen.add(await (await d.findElement(byTest("run-state"))).getText()); } catch {}
    return seen.has("succeeded");
  }, 90_000, "job never succeeded");
  assert.ok(seen.has("queued") && seen.has("running"), `states seen: ${[...seen]}`);
  await waitText("run-log", (t) => t.includes("hello-from-the-container") && t.includes("done"));
  assert.equal(await (await d.findElement(byTest("run-exit"))).getText(), "0");
  await shot("4-run");

  // History: the run is there; opening it shows the container's output.
  await d.executeScript(`location.hash = "#/history"`);
  const hrow = await waitFor(`history-row-${jobId}`);
  assert.match(await hrow.getAttribute("textContent"), /hello-e2e/);
  await waitFor("timeline");
  await shot("5-history");
  await hrow.click();
  await waitText("run-log", (t) => t.includes("hello-from-the-container"));

  // Usage: my row (highlighted) counts the two finished jobs.
  await d.executeScript(`location.hash = "#/usage"`);
  const cells = async () => Promise.all((await (await waitFor(`usage-row-${me}`)).findElements(By.css("td"))).map((c) => c.getText()));
  await d.wait(async () => { try { return (await cells())[2] === "2"; } catch { return false; } }, 20_000, "usage never counted 2 jobs");
  const [user, gpuHours] = await cells();
  assert.equal(user, `${me} (you)`);
  assert.ok(Number(gpuHours) > 0, `GPU-hours ${gpuHours}`);
  assert.match(await (await d.findElement(byTest("usage-fair-share"))).getText(), /halved every/);
  // The charts: my GPU-hours in the stacked bars, and the utilization heat map, both drawn (uPlot).
  const charted = async () => ((await (await d.findElement(byTest("usage-stacked"))).getAttribute("data-users")) ?? "").split(",").includes(me);
  await d.wait(async () => { try { return await charted(); } catch { return false; } }, 20_000, "the usage chart never showed my GPU-hours");
  assert.equal((await d.findElements(By.css('[data-testid="usage-stacked"] .uplot'))).length, 1, "the stacked chart is drawn");
  assert.equal((await d.findElements(By.css('[data-testid="usage-heat"] .uplot'))).length, 1, "the heat map is drawn");
  await shot("5b-usage");
});

test("start a session from the Queue view, see its end and attach command, and book a slot on the bookings timeline", async () => {
  // Sessions: a shell (no GPU) in the demo image, for 30 min.
  await d.executeScript(`location.hash = "#/queue"`);
  await (await waitFor("session-gpus")).clear();
  await (await d.findElement(byTest("session-gpus"))).sendKeys("0");
  await (await d.findElement(byTest("session-length"))).sendKeys("30m");
  await (await d.findElement(byTest("session-image"))).sendKeys("gantry-test/busybox:1");
  await (await d.findElement(byTest("session-start"))).click();
  const said = await waitText("session-out", (t) => /Session \d+ queued/.test(t) || /error|refused|not/i.test(t), 30_000);
  const id = Number(said.match(/Session (\d+) queued/)?.[1] ?? assert.fail(`no session: ${said}`));
  assert.match(said, new RegExp(`gantry attach ${id}`));
  // Its row: the session class, its end ("ends in 29 min"), and (running, mine) the attach command to copy.
  await waitText(`session-${id}`, (t) => /^session · ends in (29|30) min$/.test(t), 90_000);
  // Re-read each time: the queue redraws its rows every 2 s.
  const inRow = By.css(`[data-testid="queue-row-${id}"] [data-testid="attach-${id}"] code`);
  await d.wait(async () => { try { return (await (await d.findElement(inRow)).getText()) === `gantry attach ${id}`; } catch { return false; } }, 90_000, "no attach command on the running session's row");
  await shot("5c-session");
  await d.wait(async () => { try { await (await d.findElement(byTest(`cancel-${id}`))).click(); return true; } catch { return false; } }, 20_000, "cannot cancel the session");

  // Bookings: the GPUs x hours timeline; drag across GPU 0's row, book it with a note, see it mine.
  await d.executeScript(`location.hash = "#/bookings"`);
  await waitFor("tl-row-0");
  await waitText("bookings-rules", (t) => t.startsWith("Slots of 30 min"), 20_000);
  // 30 min slots are 14 px: from the 6th slot to the 9th (within 5 h). Viewport coordinates: the row is
  // wider than the window, so offsets from its in-view centre would depend on the scroll.
  const r = await d.executeScript(`const b = document.querySelector('[data-testid="tl-row-0"]').getBoundingClientRect(); return [b.left, b.top + b.height / 2];`);
  const [left, mid] = r.map(Math.round);
  await d.actions().move({ origin: "viewport", x: left + 5 * 14 + 4, y: mid }).press().move({ origin: "viewport", x: left + 8 * 14 + 4, y: mid }).release().perform();
  await (await waitFor("book-note")).sendKeys("e2e demo");
  await (await d.findElement(byTest("book-submit"))).click();
  const mine = await d.wait(async () => {
    for (const el of await d.findElements(By.css(".tl-booking.mine"))) if ((await el.getAttribute("textContent")) === "mine: e2e demo") return el;
    const refused = await d.findElements(By.css('[data-testid="book-form"] .error'));
    if (refused.length) { await shot("5d-bookings-refused"); assert.fail(`the booking was refused: ${await refused[0].getText()}`); }
    return null;
  }, 20_000, "the booking never showed as mine on the timeline").catch(async (e) => { await shot("5d-bookings-failed"); throw e; });
  const bid = Number((await mine.getAttribute("data-testid")).split("-")[2]);
  assert.match(await (await waitFor(`booking-${bid}`)).getText(), /e2e demo/);
  await shot("5d-bookings");
  await (await d.findElement(byTest(`cancel-booking-${bid}`))).click();
  await d.wait(async () => (await d.findElements(byTest(`booking-${bid}`))).length === 0, 20_000, "the cancelled booking stayed listed");
});
