// Shared by the e2e files: tauri-driver (+ WebKitWebDriver) on a port pair, and one WebDriver session.
import { spawn } from "node:child_process";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Builder } from "selenium-webdriver";

export const driverBin = process.env.TAURI_DRIVER ?? path.join(os.homedir(), ".cargo/bin/tauri-driver");

export function waitPort(port, ms) {
  const end = Date.now() + ms;
  return new Promise((resolve, reject) => {
    const tryOnce = () => {
      const s = net.connect(port, "127.0.0.1", () => { s.end(); resolve(); });
      s.on("error", () => (Date.now() > end ? reject(new Error(`port ${port} never opened`)) : setTimeout(tryOnce, 100)));
    };
    tryOnce();
  });
}

/** tauri-driver on `port`, its WebKitWebDriver on `nativePort`; the app inherits `env` (plus the drivers' own). */
export async function startDriver(port, nativePort, env) {
  const proc = spawn(driverBin, ["--port", String(port), "--native-port", String(nativePort)], { env, stdio: ["ignore", "inherit", "inherit"] });
  await waitPort(port, 20_000);
  return proc;
}

/** A session on the app binary at `application`; without DISPLAY WebKitWebDriver would wait forever. */
export function openSession(port, application) {
  const caps = { browserName: "wry", "tauri:options": { application } };
  return Promise.race([
    new Builder().usingServer(`http://127.0.0.1:${port}/`).withCapabilities(caps).build(),
    new Promise((_, rej) => setTimeout(() => rej(new Error("WebDriver session did not open in 60 s")), 60_000)),
  ]);
}

/** Never SIGKILL tauri-driver: it would orphan WebKitWebDriver on its native port. */
export async function stopDriver(proc) {
  proc?.kill("SIGTERM");
  await new Promise((r) => setTimeout(r, 500));
}
