// App benchmark (prints numbers; not a test). Run via scripts/bench-app.sh, which seeds 100,000
// history rows and sets up Xvfb. Measures, on the real app with 8 simulated GPUs:
//  - resident memory (app + WebKit processes) after an hour's worth of samples (3,600+ at 10 ms)
//  - time to open History and to scroll it to far positions (in-page timing)
//  - CPU use while idle on the GPUs view at the normal 1 Hz
import { spawn, execSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Builder } from "selenium-webdriver";

const repo = path.resolve(import.meta.dirname, "../..");
const app = path.join(repo, "target/debug/gantry-app");
const state = process.argv[2];
const driverBin = process.env.TAURI_DRIVER ?? path.join(os.homedir(), ".cargo/bin/tauri-driver");
const out = [];

const waitPort = (port) => new Promise((res, rej) => {
  const end = Date.now() + 20000;
  const go = () => { const s = net.connect(port, "127.0.0.1", () => { s.end(); res(); }); s.on("error", () => Date.now() > end ? rej(new Error("no port")) : setTimeout(go, 100)); };
  go();
});

function procTree(rootPid) {
  const pids = [rootPid];
  for (let i = 0; i < pids.length; i++) {
    try { pids.push(...fs.readFileSync(`/proc/${pids[i]}/task/${pids[i]}/children`, "utf8").trim().split(/\s+/).filter(Boolean).map(Number)); } catch {}
  }
  return pids;
}
const rssMb = (pids) => pids.reduce((s, p) => { try { return s + Number(fs.readFileSync(`/proc/${p}/status`, "utf8").match(/VmRSS:\s+(\d+)/)[1]); } catch { return s; } }, 0) / 1024;
const ticks = (pids) => pids.reduce((s, p) => { try { const f = fs.readFileSync(`/proc/${p}/stat`, "utf8").split(") ")[1].split(" "); return s + Number(f[11]) + Number(f[12]); } catch { return s; } }, 0);

async function session(env) {
  const drv = spawn(driverBin, [], { env: { ...process.env, GANTRY_STATE_DIR: state, GANTRY_GPUS: "sim:8x80GiB", ...env }, stdio: "ignore" });
  await waitPort(4444);
  const d = await new Builder().usingServer("http://127.0.0.1:4444/").withCapabilities({ browserName: "wry", "tauri:options": { application: app } }).build();
  await d.wait(async () => (await d.executeScript("return !!document.querySelector('[data-testid=gpu-7]')")), 30000);
  const appPid = Number(execSync(`pgrep -n -f ${app}`).toString().trim());
  return { d, drv, appPid };
}
async function close({ d, drv }) {
  await d.quit().catch(() => {});
  drv.kill("SIGTERM");
  await new Promise((r) => setTimeout(r, 1500));
}

// Phase 1: an hour of samples at 10 ms, 100k history rows.
{
  const s = await session({ GANTRY_SAMPLE_MS: "10" });
  await new Promise((r) => setTimeout(r, 45_000));
  const n = await s.d.executeScript("return 0");
  void n;
  out.push(["resident memory after 3,600+ samples x 8 GPUs, 100k runs (app + WebKit processes)", `${rssMb(procTree(s.appPid)).toFixed(0)} MB`]);
  const open = await s.d.executeAsyncScript(`
    const cb = arguments[arguments.length - 1];
    const t0 = performance.now();
    location.hash = "#/history";
    const check = () => {
      const c = document.querySelector("[data-testid=history-count]");
      if (c && c.textContent.startsWith("100,000") && document.querySelector(".vt-row:not(.loading)")) cb(performance.now() - t0);
      else requestAnimationFrame(check);
    };
    check();`);
  out.push(["open History (100,000 runs) until the first page shows", `${open.toFixed(0)} ms`]);
  const scrolls = await s.d.executeAsyncScript(`
    const cb = arguments[arguments.length - 1];
    const sc = document.querySelector("[data-testid=history-scroll]");
    const targets = [50000, 99000, 1000, 75000, 25000];
    const times = [];
    const next = () => {
      if (!targets.length) return cb(times);
      const row = targets.shift();
      const t0 = performance.now();
      sc.scrollTop = row * 30;
      sc.dispatchEvent(new Event("scroll"));
      const check = () => {
        const rows = sc.querySelectorAll(".vt-row:not(.loading)");
        if (rows.length > 5) { times.push(performance.now() - t0); setTimeout(next, 50); }
        else requestAnimationFrame(check);
      };
      check();
    };
    next();`);
  scrolls.sort((a, b) => a - b);
  out.push(["scroll History to a far position until rows show (median of 5 jumps)", `${scrolls[2].toFixed(0)} ms (max ${scrolls[4].toFixed(0)} ms)`]);
  await close(s);
}

// Phase 2: idle at the normal 1 Hz on the GPUs view (live charts).
{
  const s = await session({});
  await new Promise((r) => setTimeout(r, 5000));
  const pids = procTree(s.appPid);
  const t0 = ticks(pids);
  await new Promise((r) => setTimeout(r, 30_000));
  const cpu = (ticks(pids) - t0) / 100 / 30 * 100;
  out.push(["CPU while idle on the GPUs view (8 live charts at 1 Hz), app + WebKit", `${cpu.toFixed(1)}% of one core`]);
  out.push(["resident memory at that point", `${rssMb(pids).toFixed(0)} MB`]);
  await close(s);
}

const table = "| app benchmark | result |\n|---|---|\n" + out.map(([a, b]) => `| ${a} | ${b} |`).join("\n") + "\n";
console.log(table);
fs.mkdirSync(path.join(repo, "target/bench"), { recursive: true });
fs.writeFileSync(path.join(repo, "target/bench/app.md"), table);
process.exit(0);
