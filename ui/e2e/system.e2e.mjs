// End-to-end: a researcher opens the app on a shared machine with a system engine. The app runs as the
// real user gantry-alice with an empty environment except DISPLAY, HOME and USER (as a desktop menu
// would start it, without any Gantry variable) and must find the system engine at /run/gantry/gantry.sock
// and say so in its header. Needs root (setpriv), Xvfb, Docker; scripts/e2e.sh sets it up.
//
// How the app runs as alice: tauri-driver and WebKitWebDriver run as root, and the "application" they
// launch is a two-line wrapper that drops to alice (setpriv --init-groups) and clears the environment
// (env -i) before exec'ing the app. Only WebDriver's own plumbing passes through: WEBKIT_INSPECTOR_SERVER
// (WebKitWebDriver's automation channel, a 127.0.0.1 port) and TAURI_AUTOMATION /
// TAURI_WEBVIEW_AUTOMATION (set by tauri-driver so the webview accepts automation). Alice must be able
// to execute the binary: it is hard-linked (or copied) into a 0755 temp dir, since the checkout may sit
// under a directory she cannot enter.
//
// The system engine: one that already answers at /run/gantry/gantry.sock is used as is. Otherwise this
// starts `gantry daemon --system` with its state under a temp root (GANTRY_SYSTEM_ROOT, so the machine's
// /var/lib/gantry is never touched) and links /run/gantry/gantry.sock to its socket; at the end it stops
// that engine and removes only the link, /run/gantry if it created it, and its temp root.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { By, until } from "selenium-webdriver";
import { openSession, startDriver, stopDriver } from "./driver.mjs";

const repo = path.resolve(import.meta.dirname, "../..");
const app = process.env.GANTRY_APP ?? path.join(repo, "target/debug/gantry-app");
const gantry = path.join(repo, "target/debug/gantry");
const shots = process.env.GANTRY_SHOTS ?? path.join(repo, "target/e2e-shots");
const SYSTEM_SOCKET = "/run/gantry/gantry.sock";
const ALICE = "gantry-alice";
const work = fs.mkdtempSync(path.join(os.tmpdir(), "gantry-e2e-alice-"));
const made = { engine: null, link: false, runDir: false };
let driverProc;
let d;

assert.ok(process.env.DISPLAY, "DISPLAY must be set (run under Xvfb): without it the app aborts in GTK init");
assert.equal(process.getuid(), 0, "run as root: the app is started as gantry-alice through setpriv");

const answers = (socket) => new Promise((resolve) => {
  const s = net.connect(socket, () => { s.end(); resolve(true); });
  s.on("error", () => resolve(false));
});

async function until_(what, f, ms = 60_000) {
  const end = Date.now() + ms;
  while (!(await f())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The system engine at the real socket: a live one, or ours (see the top of the file). */
async function systemEngine() {
  if (await answers(SYSTEM_SOCKET)) return;
  const root = path.join(work, "root");
  fs.mkdirSync(root, { mode: 0o755 });
  const log = fs.openSync(path.join(work, "system-engine.log"), "a");
  const env = { ...process.env, GANTRY_SYSTEM_ROOT: root };
  delete env.GANTRY_STATE_DIR;
  made.engine = spawn(gantry, ["daemon", "--system", "--gpus", "sim:2x24GiB@e2e-system"], { env, stdio: ["ignore", log, log] });
  const ours = path.join(root, "run/gantry/gantry.sock");
  await until_("the system engine to answer", () => answers(ours));
  if (!fs.existsSync("/run/gantry")) {
    fs.mkdirSync("/run/gantry", { mode: 0o755 });
    made.runDir = true;
  }
  // A socket file nobody answers on is a stopped engine's: the engine itself would replace it too.
  let stale = null;
  try { stale = fs.lstatSync(SYSTEM_SOCKET); } catch {}
  if (stale) {
    assert.ok(stale.isSocket(), `${SYSTEM_SOCKET} is not a socket and no engine answers there: remove it and run again`);
    fs.unlinkSync(SYSTEM_SOCKET);
  }
  fs.symlinkSync(ours, SYSTEM_SOCKET);
  made.link = true;
}

/** The app binary where alice can run it, and the wrapper WebKitWebDriver launches instead of it. */
function appAsAlice() {
  fs.chmodSync(work, 0o755);
  const bin = path.join(work, "gantry-app");
  try { fs.linkSync(app, bin); } catch { fs.copyFileSync(app, bin); }
  fs.chmodSync(bin, 0o755);
  const home = spawnSync("sh", ["-c", `getent passwd ${ALICE} | cut -d: -f6`], { encoding: "utf8" }).stdout.trim();
  assert.ok(home, `user ${ALICE} must exist (scripts/e2e.sh creates it)`);
  const wrapper = path.join(work, "app-as-alice");
  fs.writeFileSync(wrapper, `#!/bin/sh
exec /usr/bin/setpriv --reuid=${ALICE} --regid=${ALICE} --init-groups /usr/bin/env -i DISPLAY="$DISPLAY" HOME=${home} USER=${ALICE} \\
  WEBKIT_INSPECTOR_SERVER="$WEBKIT_INSPECTOR_SERVER" TAURI_AUTOMATION="$TAURI_AUTOMATION" TAURI_WEBVIEW_AUTOMATION="$TAURI_WEBVIEW_AUTOMATION" \\
  ${bin} "$@"
`, { mode: 0o755 });
  return wrapper;
}

before(async () => {
  await systemEngine();
  const wrapper = appAsAlice();
  driverProc = await startDriver(4446, 4447, { ...process.env });
  d = await openSession(4446, wrapper);
});

after(async () => {
  try { await d?.quit(); } catch {}
  await stopDriver(driverProc);
  if (made.link) fs.unlinkSync(SYSTEM_SOCKET);
  if (made.runDir) fs.rmdirSync("/run/gantry");
  if (made.engine && made.engine.exitCode === null && made.engine.signalCode === null) {
    made.engine.kill("SIGTERM");
    await new Promise((r) => made.engine.once("exit", r));
  }
  fs.rmSync(work, { recursive: true, force: true });
});

test("alice's app, started with only DISPLAY, HOME and USER, finds the system engine and says so", async () => {
  const byTest = (id) => By.css(`[data-testid="${id}"]`);
  const header = await d.wait(until.elementLocated(byTest("engine")), 30_000, "no engine line in the header");
  assert.equal(await header.getText(), `System engine (${SYSTEM_SOCKET})`);
  // The engine knows her by the socket's peer credentials: she is alice, not root.
  assert.equal(await (await d.findElement(byTest("me"))).getText(), ALICE);
  fs.mkdirSync(shots, { recursive: true });
  fs.writeFileSync(path.join(shots, "6-alice-system-engine.png"), await d.takeScreenshot(), "base64");
});
