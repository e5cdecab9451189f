// End-to-end: a researcher's laptop app connects to a workstation through a real SSH tunnel. Needs root,
// Xvfb, Docker and openssh-server; scripts/e2e.sh sets it up.
//
// The "workstation": a `gantry daemon --system` under a temp root (its socket is not /run/gantry, so it
// never meets the machine's own engine) and a private sshd on 127.0.0.1 (tests/sshd/start.sh) where
// gantry-alice logs in with a key made here; her sessions find `gantry` and that engine's socket. The
// "laptop": the app run as root with its own engine (a temp state dir) and an ssh config naming
// `gantry-alice-ws` (GANTRY_SSH="ssh -F …"). Through the header's machine switcher it uses the
// workstation: alice's identity, her queue, submit by drop, the live log, cancel, and a lost connection
// (sshd stopped, then started again) that shows a banner and reconnects by itself.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { By, Key, until } from "selenium-webdriver";
import { openSession, startDriver, stopDriver } from "./driver.mjs";

const repo = path.resolve(import.meta.dirname, "../..");
const app = process.env.GANTRY_APP ?? path.join(repo, "target/debug/gantry-app");
const gantry = path.join(repo, "target/debug/gantry");
const shots = process.env.GANTRY_SHOTS ?? path.join(repo, "target/e2e-shots");
const HOST = "gantry-alice-ws";
const work = fs.mkdtempSync(path.join(os.tmpdir(), "gantry-e2e-remote-"));
const sshd = path.join(work, "sshd");
const root = path.join(work, "root");
const socket = path.join(root, "run/gantry/gantry.sock");
let engine;
let driverProc;
let d;

assert.ok(process.env.DISPLAY, "DISPLAY must be set (run under Xvfb)");
assert.equal(process.getuid(), 0, "run as root: the test makes an sshd and keys for gantry-alice");

const byTest = (id) => By.css(`[data-testid="${id}"]`);
const waitFor = (id, ms = 30_000) => d.wait(until.elementLocated(byTest(id)), ms, `no element ${id}`);
const answers = (s) => new Promise((resolve) => {
  const c = net.connect(s, () => { c.end(); resolve(true); });
  c.on("error", () => resolve(false));
});

async function shot(name) {
  fs.mkdirSync(shots, { recursive: true });
  fs.writeFileSync(path.join(shots, `${name}.png`), await d.takeScreenshot(), "base64");
}

async function waitText(id, pred, ms = 60_000) {
  let last = "";
  try {
    await d.wait(async () => {
      try { last = await (await d.findElement(byTest(id))).getText(); } catch { return false; }
      return pred(last);
    }, ms);
  } catch (e) {
    throw new Error(`${id} never matched; last text: ${last}; the window says: ${await d.executeScript("return document.body.innerText")}`);
  }
  return last;
}

/** The workstation engine's view of a job (as root, on the workstation side). */
function workstation(...args) {
  const env = { ...process.env, GANTRY_SYSTEM_SOCKET: socket };
  delete env.GANTRY_STATE_DIR;
  const r = spawnSync(gantry, args, { encoding: "utf8", env });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout;
}
const show = (id) => JSON.parse(workstation("--json", "show", String(id)));

before(async () => {
  fs.chmodSync(work, 0o755);
  fs.mkdirSync(root, { mode: 0o755 });
  const log = fs.openSync(path.join(work, "engine.log"), "a");
  const env = { ...process.env, GANTRY_SYSTEM_ROOT: root };
  delete env.GANTRY_STATE_DIR;
  engine = spawn(gantry, ["daemon", "--system", "--gpus", "sim:1x24GiB@e2e-remote"], { env, stdio: ["ignore", log, log] });
  const end = Date.now() + 60_000;
  while (!(await answers(socket))) {
    assert.ok(Date.now() < end, "the workstation's engine never answered");
    await new Promise((r) => setTimeout(r, 100));
  }
  const s = spawnSync(path.join(repo, "tests/sshd/start.sh"), [sshd, gantry, socket, "gantry-alice"], { encoding: "utf8" });
  assert.equal(s.status, 0, `sshd: ${s.stderr}`);
  fs.mkdirSync(path.join(work, "local-state"));
  driverProc = await startDriver(4448, 4449, {
    ...process.env,
    GANTRY_STATE_DIR: path.join(work, "local-state"),
    GANTRY_GPUS: "sim:1x24GiB@e2e-laptop",
    GANTRY_SSH: `ssh -F ${path.join(sshd, "ssh_config")}`,
    // The laptop's ssh connection sharing and saved machines, away from root's own.
    XDG_STATE_HOME: path.join(work, "laptop-state"),
    XDG_CONFIG_HOME: path.join(work, "laptop-config"),
  });
  d = await openSession(4448, app);
});

after(async () => {
  try { await d?.quit(); } catch {}
  await stopDriver(driverProc);
  spawnSync(path.join(repo, "tests/sshd/stop.sh"), [sshd]);
  let engineId = null;
  try { engineId = JSON.parse(workstation("--json", "status")).engine_id; } catch {}
  if (engine && engine.exitCode === null && engine.signalCode === null) {
    engine.kill("SIGTERM");
    await new Promise((r) => engine.once("exit", r));
  }
  // Its containers outlive the engine by design; a job left running would hold the simulated GPU next time.
  if (engineId) spawnSync("sh", ["-c", `ids=$(docker ps -aq --filter label=dev.gantry.engine=${engineId}); [ -z "$ids" ] || docker rm -f $ids >/dev/null`]);
  fs.rmSync(work, { recursive: true, force: true });
});

test("the laptop's app uses the workstation through ssh: alice's queue, drop, run, log, cancel, reconnect", async () => {
  await waitText("engine", (t) => t.startsWith("Engine in this app"));
  // The switcher: This computer, then a workstation typed in (an ssh config Host).
  const select = await waitFor("machine");
  await select.findElement(By.css("option:last-child")).click();
  const hostInput = await waitFor("machine-host");
  await hostInput.sendKeys(HOST, Key.ENTER);
  // The UI reloads on the workstation's engine, which knows her as the ssh user, not root.
  await waitText("engine", (t) => t === `${HOST} (through ssh)`);
  assert.equal(await (await waitFor("me")).getText(), "gantry-alice");
  await waitFor("gpu-0");
  await shot("7-remote-gpus");

  // Drop two specs from the laptop: their text goes to the workstation. A relative mount cannot.
  const long = path.join(work, "long.yaml");
  const hello = path.join(work, "hello.yaml");
  const rel = path.join(work, "relative.yaml");
  fs.writeFileSync(long, "name: long-remote\nimage: gantry-test/busybox:1\ncommand: sleep 300\ngpus: 1\n");
  fs.writeFileSync(hello, "name: hello-remote\nimage: gantry-test/busybox:1\ncommand: 'echo hello-over-ssh; id -u; sleep 1'\ngpus: 0\n");
  fs.writeFileSync(rel, "image: gantry-test/busybox:1\ngpus: 0\nmounts: ['data:/data']\n");
  await d.executeScript("return window.__gantryDrop(arguments[0])", [long, hello, rel]);
  await d.wait(async () => (await d.findElements(byTest("preview-ok"))).length === 2, 30_000, "two previews");
  assert.match(await (await waitFor("preview-error")).getText(), /relative paths are local-only/);
  await shot("8-remote-preview");
  await (await d.findElement(byTest("submit-confirm"))).click();
  await d.wait(async () => (await d.findElements(byTest("submitted-job"))).length === 2, 30_000, "two submitted");
  const ids = await Promise.all((await d.findElements(byTest("submitted-job"))).map((l) => l.getAttribute("data-job")));
  const [longId, helloId] = ids.map(Number);
  assert.equal(show(helloId).job.owner, "gantry-alice");

  // Watch it run and read its log, live through the tunnel.
  await d.executeScript(`location.hash = "#/run/${helloId}"`);
  await waitText("run-state", (t) => t === "succeeded", 90_000);
  const uid = spawnSync("id", ["-u", "gantry-alice"], { encoding: "utf8" }).stdout.trim();
  await waitText("run-log", (t) => t.includes("hello-over-ssh") && t.includes(uid));
  await shot("9-remote-run");

  // Cancel the other from the queue.
  await d.executeScript(`location.hash = "#/queue"`);
  await d.wait(async () => show(longId).job.state === "running", 60_000).catch(() => assert.fail(`long job never ran: ${workstation("ls")}`));
  const cancel = await waitFor(`cancel-${longId}`);
  await cancel.click();
  await d.wait(async () => show(longId).job.state === "cancelled", 60_000, "long job never cancelled");
  await shot("10-remote-queue");

  // The connection drops (the sshd and its sessions stop): a banner; then it comes back by itself.
  spawnSync(path.join(repo, "tests/sshd/stop.sh"), [sshd]);
  await waitText("connection-lost", (t) => t.startsWith(`Lost the connection to ${HOST}`), 60_000);
  await shot("11-remote-lost");
  const again = spawnSync("/usr/sbin/sshd", ["-f", path.join(sshd, "sshd_config"), "-E", path.join(sshd, "sshd.log")]);
  assert.equal(again.status, 0, "sshd did not start again");
  await d.wait(async () => {
    try { return !(await (await d.findElement(byTest("connection-lost"))).isDisplayed()) && (await (await d.findElement(byTest("engine"))).getText()) === `${HOST} (through ssh)`; } catch { return false; }
  }, 90_000, "never reconnected");
  await waitFor("view-queue");
  await shot("12-remote-reconnected");
});
