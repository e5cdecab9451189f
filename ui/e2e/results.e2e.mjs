// End-to-end (issue 30): a 3-run matrix sweep logging JSON lines to $GANTRY_METRICS, seeded through
// the CLI into the real app's embedded engine (simulated GPUs, real Docker); then the run page's
// metric chart and efficiency, History's Compare and the sweep's params × metric view, with screenshots.
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
const cli = path.join(repo, "target/debug/gantry");
const shots = process.env.GANTRY_SHOTS ?? path.join(repo, "target/e2e-shots");
const work = fs.mkdtempSync(path.join(os.tmpdir(), "gantry-e2e-results-"));
const state = path.join(work, "state");
let driverProc;
let d;

assert.ok(process.env.DISPLAY, "DISPLAY must be set (run under Xvfb): without it the app aborts in GTK init");

async function shot(name) {
  fs.mkdirSync(shots, { recursive: true });
  fs.writeFileSync(path.join(shots, `${name}.png`), await d.takeScreenshot(), "base64");
}
const byTest = (id) => By.css(`[data-testid="${id}"]`);
const waitFor = (id, ms = 60_000) => d.wait(until.elementLocated(byTest(id)), ms, `no element ${id}`);
const gantry = (...args) => {
  const r = spawnSync(cli, ["--state-dir", state, ...args], { encoding: "utf8" });
  assert.equal(r.status, 0, `gantry ${args.join(" ")}: ${r.stderr}`);
  return r.stdout;
};

before(async () => {
  fs.mkdirSync(state);
  // Its own ports: app.e2e.mjs uses 4444/4445 (the files run one after the other, but a killed run may linger).
  driverProc = await startDriver(4454, 4455, { ...process.env, GANTRY_STATE_DIR: state, GANTRY_GPUS: "sim:2x24GiB" });
  d = await openSession(4454, app);
});

after(async () => {
  const st = spawnSync(cli, ["--state-dir", state, "--json", "status"], { encoding: "utf8" });
  const engineId = st.status === 0 ? JSON.parse(st.stdout).engine_id : null;
  try { await d?.quit(); } catch {}
  await stopDriver(driverProc);
  if (engineId) spawnSync("sh", ["-c", `ids=$(docker ps -aq --filter label=dev.gantry.engine=${engineId}); [ -z "$ids" ] || docker rm -f $ids >/dev/null`]);
});

test("a sweep's metric curves on the run page, compared from History, ranked by params", async () => {
  await waitFor("engine");
  // Three runs of one matrix: 20 steps of a loss that falls faster with a larger lr.
  const spec = path.join(work, "sweep.yaml");
  const awk = 'BEGIN { f = ENVIRON["GANTRY_METRICS"]; lr = ENVIRON["LR"]; for (s = 0; s < 20; s++) printf "{\\"step\\": %d, \\"loss\\": %.4f}\\n", s, 1 / (1 + s * lr) >> f; close(f); system("sleep 2") }';
  fs.writeFileSync(spec, [
    "name: sweep",
    "image: gantry-test/busybox:1",
    "gpus: 1",
    "gpu_memory: 4GiB",
    "matrix: {lr: [0.3, 0.1, 0.03]}",
    // argv (YAML takes JSON): no shell quoting; busybox's awk writes the JSON lines, lr from the
    // matrix's environment variable (LR).
    `command: ${JSON.stringify(["/bin/busybox", "awk", awk])}`,
    "",
  ].join("\n"));
  gantry("submit", spec);
  const ids = JSON.parse(gantry("--json", "history")).filter((r) => r.name.startsWith("sweep[")).map((r) => r.id);
  const wanted = 3;
  const t0 = Date.now();
  let done = ids;
  while (done.length < wanted && Date.now() - t0 < 120_000) {
    await new Promise((r) => setTimeout(r, 1000));
    done = JSON.parse(gantry("--json", "history")).filter((r) => r.name.startsWith("sweep[") && r.status === "succeeded").map((r) => r.id);
  }
  assert.equal(done.length, wanted, "the three runs succeeded");
  done.sort((a, b) => a - b);

  // The run page: the loss against step, its params, its efficiency.
  await d.executeScript(`location.hash = "#/run/${done[0]}"`);
  const chart = await waitFor("run-metric-loss");
  assert.equal(await chart.getAttribute("data-points"), "20");
  assert.match(await (await waitFor("run-params")).getText(), /lr\s*0\.3/);
  assert.match(await (await waitFor("run-efficiency")).getText(), /GPU memory\s*peak 4\.0 GiB/);
  await d.executeScript(`document.querySelector('[data-testid="run-efficiency"]').scrollIntoView()`);
  await shot("results-1-run-metric-chart");

  // History: tick the three runs, Compare.
  await d.executeScript(`location.hash = "#/history"`);
  for (const id of done) await (await waitFor(`history-tick-${id}`)).click();
  await (await waitFor("history-compare")).click();
  await waitFor("compare-rows");
  const first = await d.findElement(By.css("[data-testid=compare-rows] tbody tr"));
  // lr 0.3 falls fastest: best (lowest loss), marked.
  assert.match(await first.getText(), /★/);
  assert.match(await first.getText(), /0\.3/);
  const curve = await waitFor("compare-curve-loss");
  assert.equal(await curve.getAttribute("data-runs"), "3");
  const lr = await d.findElement(By.css("[data-testid=compare-params] tbody tr"));
  assert.equal(await lr.getAttribute("data-differs"), "true");
  await shot("results-2-compare");

  // The sweep by name: each varied param against the metric.
  await d.executeScript(`location.hash = "#/compare/name/sweep"`);
  const plot = await waitFor("compare-param-lr");
  assert.equal(await plot.getAttribute("data-points"), "3");
  await d.executeScript(`document.querySelector('[data-testid="compare-sweep"]').scrollIntoView()`);
  await shot("results-3-sweep-params");
});
