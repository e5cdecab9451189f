import { describe, expect, it, vi } from "vitest";
const drawn = vi.hoisted(() => ({ bars: [] as any[], heat: [] as any[] }));
vi.mock("./charts", () => ({
  lineChart: () => ({ setData() {}, destroy() {} }),
  stackedBars: (_el: unknown, _w: number, _h: number, s: unknown) => { drawn.bars.push(s); return { setData() {}, destroy() {} }; },
  heatMap: (_el: unknown, _w: number, _h: number, g: unknown) => { drawn.heat.push(g); return { setData() {}, destroy() {} }; },
}));
import { entry, fakeBackend, gpu, gpuUser, engineStatus, settle, usageCharts, usageReport, validJob } from "./fake-backend";
import { clock, gpusView, holderLine, holdersOf } from "./views/gpus";
import { bucketFor, fairShareLine, heatSummary, usageRows, usageView } from "./views/usage";
import { gpuList, historyView, ROW_H } from "./views/history";
import { queueView, sortQueue } from "./views/queue";
import { errorText, planText, submitView } from "./views/submit";
import { mount, simBanner } from "./main";
import type { EngineInfo, GpuStatus, GpuUser, Preview } from "./types";

describe("queue view", () => {
  it("shows why a job waits and offers cancel only on my jobs", async () => {
    const q = [entry(1, { state: "running", owner_uid: 1000 }, { gpus_assigned: [0], position: null, reason: null }),
               entry(2, { owner_uid: 1001, owner: "bob" }, { position: 1, reason: "needs 2 free GPUs, 1 available" })];
    const { b, calls } = fakeBackend({ queue: () => Promise.resolve(q) });
    const v = queueView(b, 1000, () => {});
    await settle();
    const rows = v.el.querySelectorAll("tbody tr");
    expect(rows.length).toBe(2);
    expect(rows[1].textContent).toContain("needs 2 free GPUs, 1 available");
    expect(rows[0].textContent).toContain("GPU 0");
    expect(v.el.querySelector("[data-testid=cancel-1]")).not.toBeNull();
    expect(v.el.querySelector("[data-testid=cancel-2]")).toBeNull();
    (v.el.querySelector("[data-testid=cancel-1]") as HTMLButtonElement).click();
    await settle();
    expect(calls.filter((c) => c.name === "cancel").map((c) => c.args[0])).toEqual([1]);
  });
  it("says CPU only where a running CPU job runs, not a GPU", async () => {
    const q = [entry(7, { state: "running", gpus: 0 }, { gpus_assigned: [], position: null, reason: null })];
    const { b } = fakeBackend({ queue: () => Promise.resolve(q) });
    const v = queueView(b, 1000, () => {});
    await settle();
    const row = v.el.querySelector("[data-testid=queue-row-7]")!;
    expect(row.querySelector(".reason")!.textContent).toBe("CPU only");
    expect(row.textContent).not.toContain("GPU none");
  });
  it("lists running jobs first, then queued by position", () => {
    const q = sortQueue([entry(3, {}, { position: 2 }), entry(4, {}, { position: 1 }), entry(5, { state: "running" }, { position: null })]);
    expect(q.map((e) => e.job.id)).toEqual([5, 4, 3]);
  });
});

describe("history view", () => {
  it("pages from the backend and renders only visible rows", async () => {
    const { b, calls } = fakeBackend();
    const v = historyView(b, () => {});
    document.body.append(v.el);
    await settle(10);
    expect(v.el.querySelector("[data-testid=history-count]")!.textContent).toBe("1,000 runs");
    const rendered = v.el.querySelectorAll(".vt-row").length;
    expect(rendered).toBeGreaterThan(0);
    expect(rendered).toBeLessThan(60);
    const first = calls.find((c) => c.name === "history")!.args[0] as any;
    expect(first.limit).toBe(200);
    const scroller = v.el.querySelector("[data-testid=history-scroll]") as HTMLElement;
    // A scrollbar drag: many jumps, one frame apart, then the view rests at row 700. Only the pages
    // around where it rests are fetched, not one for every place the drag passed.
    const before = calls.filter((c) => c.name === "history").length;
    for (const row of [250, 380, 460, 540, 700]) {
      scroller.scrollTop = row * ROW_H;
      scroller.dispatchEvent(new Event("scroll"));
      await new Promise((r) => setTimeout(r, 16));
    }
    expect(v.el.querySelector("[data-testid=history-row-300]")).toBeNull(); // not yet: the view just stopped
    await new Promise((r) => setTimeout(r, 100));
    await settle(10);
    const offsets = calls.filter((c) => c.name === "history").slice(before).map((c) => (c.args[0] as any).offset);
    expect(offsets).toEqual([600]);
    expect(v.el.querySelector("[data-testid=history-row-300]")).not.toBeNull(); // row index 700 is id 300
    // A wheel notch keeps the rows still in view (the same elements: nothing rebuilt) and adds the new ones.
    const kept = v.el.querySelector("[data-testid=history-row-300]");
    scroller.scrollTop = 704 * ROW_H;
    scroller.dispatchEvent(new Event("scroll"));
    await settle(10);
    expect(v.el.querySelector("[data-testid=history-row-300]")).toBe(kept);
    const ids = [...v.el.querySelectorAll(".vt-row")].map((r) => Number(r.getAttribute("data-testid")!.split("-")[2]));
    expect(ids).toEqual([...ids].sort((a, b) => b - a)); // still in order (ids descend with the row index)
    // A wheel scroll near the end of a loaded page fetches the next one ahead of time.
    scroller.scrollTop = 770 * ROW_H;
    scroller.dispatchEvent(new Event("scroll"));
    await settle(10);
    expect(calls.filter((c) => c.name === "history").map((c) => (c.args[0] as any).offset)).toContain(800);
    expect(v.el.querySelector(".vt-row.loading")).toBeNull();
    v.el.remove();
  });
  it("writes the GPUs column so that GPU 0 and no GPU differ", async () => {
    expect(gpuList([0])).toBe("GPU 0");
    expect(gpuList([0, 1])).toBe("GPU 0,1");
    expect(gpuList([])).toBe("—");
    const { b } = fakeBackend();
    const v = historyView(b, () => {});
    await settle(10);
    const cells = v.el.querySelector("[data-testid=history-row-1000]")!.children; // makeRows: first row on GPU 0
    expect(cells[5].textContent).toBe("GPU 0");
  });
  it("filters by status and sorts by a clicked column", async () => {
    const { b, calls } = fakeBackend();
    const v = historyView(b, () => {});
    await settle(10);
    const status = v.el.querySelector("select[aria-label=Status]") as HTMLSelectElement;
    status.value = "failed";
    status.dispatchEvent(new Event("change"));
    await settle(10);
    expect(v.el.querySelector("[data-testid=history-count]")!.textContent).toBe("334 runs");
    (Array.from(v.el.querySelectorAll(".vt-head .sortable")).find((e) => e.textContent!.startsWith("Duration")) as HTMLElement).click();
    await settle(10);
    const last = calls.filter((c) => c.name === "history").pop()!.args[0] as any;
    expect(last).toMatchObject({ status: "failed", sort: "duration", asc: false });
  });
});

describe("submit view", () => {
  const previews: Preview[] = [
    { path: "/a/ok.yaml", file_name: "ok.yaml", job: validJob("ok", { image: "img", command: ["python", "train.py"] }), error: null, spec_error: null },
    { path: "/a/bad.yaml", file_name: "bad.yaml", job: null, error: "line 2", spec_error: { message: "unknown field `gpu`", line: 2, column: 1, hint: "remove it" } },
  ];
  it("previews each file with errors and line numbers, then submits only valid ones", async () => {
    const { b, calls } = fakeBackend({ previewPaths: () => Promise.resolve(previews), submitPaths: (p) => { calls.push({ name: "submitPaths", args: [p] }); return Promise.resolve([{ Ok: [7] }]); } });
    const go = vi.fn();
    const v = submitView(b, go);
    await v.handleFiles(["/a/ok.yaml", "/a/bad.yaml"]);
    expect(v.el.querySelectorAll("[data-testid=preview-ok]").length).toBe(1);
    expect(v.el.querySelector("[data-testid=preview-error]")!.textContent).toContain("line 2, column 1: unknown field `gpu`");
    const btn = v.el.querySelector("[data-testid=submit-confirm]") as HTMLButtonElement;
    expect(btn.disabled).toBe(false);
    expect(btn.textContent).toBe("Submit 1 job");
    btn.click();
    await settle();
    expect(calls.find((c) => c.name === "submitPaths")!.args[0]).toEqual(["/a/ok.yaml"]);
    expect(go).toHaveBeenCalledWith("#/run/7");
  });
  it("says where a dropped job would start, or why it would wait (the engine's dry run)", async () => {
    const job = validJob("ok", { image: "img", command: ["python", "train.py"] });
    const waits: Preview = { ...previews[0], plan: { checks: [], jobs: [{ job, starts_now: false, gpus: [], reason: "needs 1 free GPU, 0 available", estimated_start: null }] } };
    const now: Preview = { ...previews[0], plan: { checks: [], jobs: [{ job, starts_now: true, gpus: [1] }] } };
    expect(planText(now)).toBe("would start now on GPU 1");
    expect(planText(waits)).toBe("would wait: needs 1 free GPU, 0 available");
    expect(planText(previews[0])).toBe("");
    const { b } = fakeBackend({ previewPaths: () => Promise.resolve([waits]) });
    const v = submitView(b, vi.fn());
    await v.handleFiles(["/a/ok.yaml"]);
    expect(v.el.querySelector("[data-testid=preview-plan]")!.textContent).toBe("would wait: needs 1 free GPU, 0 available");
  });
  it("shows a valid file the engine's dry run refuses as refused, with the lab's words, and does not submit it", async () => {
    const refused: Preview = { path: "/a/big.yaml", file_name: "big.yaml", job: null, spec_error: null,
      error: "priority 5 is outside the range you may use (-2..2); ask an admin, or set priority: 2 or lower" };
    const { b } = fakeBackend({ previewPaths: () => Promise.resolve([refused, previews[1]]) });
    const v = submitView(b, vi.fn());
    await v.handleFiles(["/a/big.yaml", "/a/bad.yaml"]);
    const [big, bad] = [...v.el.querySelectorAll("[data-testid=preview-error]")];
    expect(big.querySelector("[data-testid=preview-verdict]")!.textContent).toBe("refused");
    expect(big.textContent).toContain("priority 5 is outside the range you may use (-2..2)");
    expect(bad.querySelector("[data-testid=preview-verdict]")!.textContent).toBe("invalid");
    expect((v.el.querySelector("[data-testid=submit-confirm]") as HTMLButtonElement).disabled).toBe(true);
  });
  it("formats spec errors with position and fix", () => {
    expect(errorText(previews[1])).toBe("line 2, column 1: unknown field `gpu`\nfix: remove it");
  });
});

describe("GPU holders and the app shell", () => {
  const at = (h: number, m: number, day = 1) => new Date(2025, 2, day, h, m).getTime(); // local time
  const status = (users: GpuUser[], reserved: number[] = []): GpuStatus =>
    ({ backend: "nvml", note: null, gpus: [0, 1, 2, 3, 4].map((i) => gpu(i)), holders: [], reserved, users, library: null });
  it("names who holds each GPU: jobs with owner, memory and start; outsiders with pid, command, user, container", () => {
    const hs = holdersOf(status([
      gpuUser(0, { job_id: 12, job_name: "train", user: "alice", used_memory: 3 * 2 ** 30, since: at(14, 2) }),
      gpuUser(1, { job_id: null, job_name: null, user: "bob", pid: 1234, command: "python train.py", container: "bob-nb", used_memory: 3 * 2 ** 30 }),
      // A container holding the GPU with no process on it yet (e.g. another engine's job): busy, not free.
      gpuUser(4, { job_id: null, job_name: null, user: null, container: "carol-run" }),
    ], [2]), "alice", at(18, 0));
    expect(hs.get(0)).toEqual([{ text: "job 12 train (alice) · 3.0 GiB · since 14:02", mine: true, job: 12, kind: "job" }]);
    expect(hs.get(1)).toEqual([{ text: "outside Gantry: pid 1234 python train.py (bob) in container bob-nb · 3.0 GiB", mine: false, job: null, kind: "outside" }]);
    expect(hs.get(2)!.map((x) => x.text)).toEqual(["reserved for interactive use"]);
    expect(hs.get(3)!.map((x) => x.text)).toEqual(["free"]);
    expect(hs.get(4)!.map((x) => x.text)).toEqual(["outside Gantry: container carol-run"]);
  });
  it("writes holder lines for partial facts and older starts", () => {
    expect(holderLine(gpuUser(0, { job_id: null, pid: 7, user: null, command: null }))).toBe("outside Gantry: pid 7");
    expect(holderLine(gpuUser(0, { job_id: null, user: null }))).toBe("outside Gantry");
    expect(holderLine(gpuUser(0, { since: at(9, 5, 1) }), at(10, 0, 3))).toBe("job 12 train (ada) · since 2025-03-01 09:05");
    expect(clock(at(9, 5), at(23, 59))).toBe("09:05");
  });
  it("renders holders as text, links jobs to their page, and re-reads them when a job changes", async () => {
    let onJob: (() => void) | null = null;
    let users: GpuUser[] = [gpuUser(1, { job_id: null, pid: 9, user: "mallory", command: "<img src=x onerror=alert(1)>" })];
    const { b, calls } = fakeBackend({
      gpus: () => { calls.push({ name: "gpus", args: [] }); return Promise.resolve(status(users, [2])); },
      onJobChanged: (cb) => { onJob = () => cb({ job_id: 12, state: "running", at: 0 }); return Promise.resolve(() => {}); },
    });
    const v = gpusView(b, "ada");
    await settle(10);
    const card = (i: number) => v.el.querySelector(`[data-testid=gpu-holders-${i}]`)!;
    expect(card(0).textContent).toBe("free");
    expect(card(1).querySelector("img")).toBeNull();
    expect(card(1).textContent).toBe("outside Gantry: pid 9 <img src=x onerror=alert(1)> (mallory)");
    expect(card(2).textContent).toBe("reserved for interactive use");
    expect(v.el.querySelector("[data-testid=gpu-0]")!.textContent).toContain("Held by");
    users = [gpuUser(0, { job_id: 12, user: "ada" })];
    onJob!();
    await settle(10);
    const link = card(0).querySelector("a[data-testid=holder-job-12]")!;
    expect(link.getAttribute("href")).toBe("#/run/12");
    expect(link.textContent).toBe("job 12 train (ada)");
    expect(link.closest("li")!.classList.contains("mine")).toBe(true);
    expect(card(1).textContent).toBe("free");
    v.dispose();
  });
  it("says clearly when GPUs are simulated, and routes a drop to the submit preview", async () => {
    let dropped: ((p: string[]) => void) | null = null;
    const { b, calls } = fakeBackend({ onFileDrop: (cb) => { dropped = cb; return Promise.resolve(() => {}); } });
    const root = document.createElement("div");
    await mount(root, b);
    expect(root.querySelector("[data-testid=sim-banner]")!.textContent).toBe("Simulated GPUs (as configured). Jobs run in real Docker containers; GPU numbers are made up.");
    dropped!(["/x/job.yaml"]);
    await settle();
    expect(location.hash).toBe("#/submit");
    expect(calls.some((c) => c.name === "previewPaths")).toBe(true);
  });
  it("shows the backend's own outage: a Slurm outage is not called a Docker one", async () => {
    const problem = "Slurm is not reachable: squeue --json: Unable to contact slurm controller";
    const { b } = fakeBackend({ status: () => Promise.resolve(engineStatus({ gpu_backend: "nvml", gpu_count: 8, inbox: "/i", backend_problem: problem })) });
    const root = document.createElement("div");
    await mount(root, b);
    const banner = root.querySelector("[data-testid=backend-banner]")!;
    expect(banner.textContent).toBe(problem);
    expect(banner.textContent).not.toContain("Docker");
  });
  it("shows a low Docker disk in a banner, with the top writers", async () => {
    const problem = "Docker's disk (/var/lib/docker) has 5.0 GiB free, below the lab's minimum of 10.0 GiB: no new job starts until space is freed (top writers: job 2 (bob) 40.0 GiB)";
    const { b } = fakeBackend({ status: () => Promise.resolve(engineStatus({ gpu_backend: "nvml", gpu_count: 8, inbox: "/i", disk_problem: problem })) });
    const root = document.createElement("div");
    await mount(root, b);
    expect(root.querySelector("[data-testid=disk-banner]")!.textContent).toBe(problem);
  });
  it("says why GPUs are simulated in words, and does not claim a missing driver when they were asked for", () => {
    expect(simBanner({ gpu_backend: "simulated", gpu_note: "no NVIDIA driver found (libnvidia-ml.so.1 missing)" }))
      .toBe("Simulated GPUs: no NVIDIA driver found (libnvidia-ml.so.1 missing). Jobs run in real Docker containers; GPU numbers are made up.");
    expect(simBanner({ gpu_backend: "simulated", gpu_note: null })).not.toContain("driver");
    expect(simBanner({ gpu_backend: "nvml", gpu_note: null })).toBeNull();
  });
  it("says in the header which engine it talks to", async () => {
    const engine: EngineInfo = { kind: "system", label: "System engine (/run/gantry/gantry.sock)", socket: "/run/gantry/gantry.sock", problem: null };
    const { b } = fakeBackend({ engine: () => Promise.resolve(engine) });
    const root = document.createElement("div");
    await mount(root, b);
    const el = root.querySelector("header [data-testid=engine]")!;
    expect(el.textContent).toBe("System engine (/run/gantry/gantry.sock)");
    expect(el.getAttribute("title")).toBe("/run/gantry/gantry.sock");
    expect(root.querySelector("header [data-testid=me]")!.textContent).toBe("ada");
  });
  it("names whose engine holds the machine, and asks nothing of an engine it cannot reach", async () => {
    const problem = "the Gantry engine of bob (pid 77, socket /home/bob/.local/state/gantry/gantry.sock) already manages this machine's GPUs: use it, or ask an admin to install the Gantry service";
    const { b, calls } = fakeBackend({ engine: () => Promise.resolve({ kind: "blocked", label: "Engine of bob (cannot connect)", socket: null, problem }) });
    const root = document.createElement("div");
    await mount(root, b);
    expect(root.querySelector("header [data-testid=engine]")!.textContent).toBe("Engine of bob (cannot connect)");
    expect(root.querySelector("[data-testid=engine-problem]")!.textContent).toBe(problem);
    expect(root.querySelector("nav")).toBeNull();
    expect(calls.map((c) => c.name)).toEqual(["machines"]); // only engine() (overridden, not recorded) and the switcher's local list
  });
});

describe("usage view", () => {
  it("formats each user's GPU-hours, jobs, mean wait and fair share, marking mine", () => {
    const rows = usageRows(usageReport(), "ada");
    expect(rows).toEqual([
      { user: "bob", gpuHours: "40.50", jobs: "12", wait: "1h 2m", fairShare: "31.25", preempted: "1.50", mine: false },
      { user: "ada", gpuHours: "2.00", jobs: "3", wait: "-", fairShare: "1.50", preempted: "0.00", mine: true },
    ]);
    expect(fairShareLine(7 * 86_400_000)).toContain("halved every 7d");
  });
  it("shows the table for the chosen window, with my row highlighted and the half-life explained", async () => {
    const { b, calls } = fakeBackend();
    const v = usageView(b, "ada");
    await settle(10);
    const since = () => calls.filter((c) => c.name === "usage").map((c) => Date.now() - (c.args[0] as number));
    expect(since()[0]).toBeGreaterThanOrEqual(7 * 86_400_000);
    expect(since()[0]).toBeLessThan(7 * 86_400_000 + 60_000);
    const ada = v.el.querySelector("[data-testid=usage-row-ada]")!;
    expect(ada.classList.contains("mine")).toBe(true);
    expect(Array.from(ada.querySelectorAll("td")).map((td) => td.textContent)).toEqual(["ada (you)", "2.00", "3", "-", "1.50", "0.00"]);
    expect(v.el.querySelector("[data-testid=usage-row-bob]")!.classList.contains("mine")).toBe(false);
    expect(v.el.querySelector("[data-testid=usage-fair-share]")!.textContent).toContain("halved every 7d");
    (v.el.querySelector("[data-window='24 h']") as HTMLButtonElement).click();
    await settle(10);
    expect(since()[1]).toBeLessThan(24 * 3_600_000 + 60_000);
    expect(v.el.querySelector("[data-window='24 h']")!.classList.contains("on")).toBe(true);
    v.dispose();
  });
  it("draws GPU-hours per user (hourly for 24 h, daily beyond) and the utilization heat map, in my time zone", async () => {
    drawn.bars.length = 0; drawn.heat.length = 0;
    const { b, calls } = fakeBackend();
    const v = usageView(b, "ada");
    await settle(10);
    const asked = () => calls.filter((c) => c.name === "usageCharts").map((c) => c.args as number[]);
    expect(asked()[0][1]).toBe(86_400_000);
    expect(asked()[0][2]).toBe(-new Date().getTimezoneOffset());
    expect(Date.now() - asked()[0][0]).toBeGreaterThanOrEqual(7 * 86_400_000);
    const bars = drawn.bars.at(-1);
    expect(bars.users).toEqual(["bob", "ada"]);
    expect(bars.values.map((u: number[]) => u.reduce((a, x) => a + x, 0))).toEqual([7, 3]);
    expect(v.el.querySelector("[data-testid=usage-stacked]")!.getAttribute("data-users")).toBe("bob,ada");
    expect(drawn.heat.at(-1).days.length).toBeGreaterThan(0);
    expect(v.el.querySelector("[data-testid=usage-heat-summary]")!.textContent).toBe("Busiest hour of the day: 09:00, 80 % mean GPU utilization.");
    (v.el.querySelector("[data-window='24 h']") as HTMLButtonElement).click();
    await settle(10);
    expect(asked()[1][1]).toBe(3_600_000);
    expect(bucketFor(30 * 86_400_000)).toBe(86_400_000);
    v.dispose();
  });
  it("says when the heat map has no samples", async () => {
    const { b } = fakeBackend({ usageCharts: () => Promise.resolve(usageCharts({ heat: [] })) });
    const v = usageView(b, "ada");
    await settle(10);
    expect(v.el.querySelector("[data-testid=usage-heat-summary]")!.textContent).toBe("No GPU samples in this window.");
    expect(heatSummary({ days: [0], cells: [new Array(24).fill(null)] })).toBe("No GPU samples in this window.");
    v.dispose();
  });
  it("says so when nobody used a GPU in the window", async () => {
    const { b } = fakeBackend({ usage: () => Promise.resolve(usageReport({ users: [] })) });
    const v = usageView(b, "ada");
    await settle(10);
    expect((v.el.querySelector("[data-testid=usage-empty]") as HTMLElement).hidden).toBe(false);
    expect((v.el.querySelector("[data-testid=usage-table]") as HTMLElement).hidden).toBe(true);
  });
});
