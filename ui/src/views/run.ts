// A run's page: spec, attempts, events, log (live tail while running), GPU chart, "Run again".
import type { Backend } from "../backend";
import { lineChart, xyChart, type Chart } from "../charts";
import { efficiencyRows, fmtNum, seriesXY } from "../results-data";
import { h, type View } from "../dom";
import { appendLog, ask, commandText, duration, stateLabel, time } from "../format";
import { gpuList } from "./history";
import { attachBox, endsIn, openButtons } from "../sessions";
import { FINAL_STATES, type Efficiency, type JobDetail, type JobResults, type RecentSample } from "../types";

/** The efficiency box: what was measured, then the advice (issue 30 item 3). */
export function efficiencyBox(e: Efficiency | null | undefined): HTMLElement {
  if (!e) return h("p", { class: "muted", "data-testid": "run-efficiency" }, "Not measured yet (the engine measures a run while it runs).");
  return h("div", { "data-testid": "run-efficiency" },
    h("dl", { class: "facts" }, efficiencyRows(e).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    e.advice.length ? h("ul", { class: "advice", "data-testid": "run-advice" }, e.advice.map((a) => h("li", {}, a))) : "");
}

/** The params table and each metric's last and best value. */
export function resultsSummary(r: JobResults): HTMLElement {
  const params = Object.entries(r.params);
  return h("div", { "data-testid": "run-results" },
    params.length ? h("table", { class: "grid", "data-testid": "run-params" }, h("thead", {}, h("tr", {}, h("th", {}, "Param"), h("th", {}, "Value"))),
      h("tbody", {}, params.map(([k, v]) => h("tr", {}, h("td", { class: "mono" }, k), h("td", { class: "mono" }, v))))) : "",
    r.metrics.length ? h("table", { class: "grid", "data-testid": "run-metrics-table" }, h("thead", {}, h("tr", {}, ["Metric", "Last", "Best", "Points"].map((t) => h("th", {}, t)))),
      h("tbody", {}, r.metrics.map((m) => h("tr", {}, h("td", { class: "mono" }, m.name), h("td", { class: "num" }, `${fmtNum(m.last)} @ ${m.last_step}`),
        h("td", { class: "num" }, m.best !== null ? `${fmtNum(m.best)} @ ${m.best_step} (${m.goal})` : "–"), h("td", { class: "num" }, String(m.count)))))) : "",
    r.ingest.notes.length ? h("ul", { class: "muted" }, r.ingest.notes.map((n) => h("li", {}, n))) : "");
}

/** Per-minute utilization of the run's GPUs, averaged across them: [seconds[], util[], mem (unused)]. */
export function runChartData(perGpu: [number, number, number][][]): [number[], number[], number[]] {
  const byMinute = new Map<number, number[]>();
  for (const rows of perGpu) for (const [m, util] of rows) (byMinute.get(m) ?? byMinute.set(m, []).get(m)!).push(util);
  const ts = [...byMinute.keys()].sort((a, b) => a - b);
  return [ts.map((t) => t / 1000), ts.map((t) => { const v = byMinute.get(t)!; return v.reduce((a, b) => a + b, 0) / v.length; }), ts.map(() => 0)];
}

/** 1 Hz samples of the run's GPUs in [from, to]: [seconds[], mean util[], mean mem used GiB (unused)]. */
export function recentChartData(rows: RecentSample[], gpus: number[], from: number, to: number): [number[], number[], number[]] {
  const sel = rows.filter(([t]) => t >= from && t <= to);
  return [sel.map(([t]) => t / 1000), sel.map(([, per]) => gpus.reduce((s, g) => s + (per[g]?.[0] ?? 0), 0) / gpus.length), sel.map(() => 0)];
}

export function runView(backend: Backend, id: number, go: (hash: string) => void): View {
  const el = h("section", { class: "view run", "data-testid": "view-run" });
  const log = h("pre", { class: "log", "data-testid": "run-log", tabindex: 0 });
  let stopLog: (() => void) | null = null;
  let unsub: (() => void) | null = null;
  let host: string | null = null;
  const problem = h("p", { class: "error", hidden: true, role: "alert" });

  /** A session's class and end, and (running, to its owner) how to attach and its ports to open. */
  function sessionFacts(d: JobDetail) {
    const j = d.job, s = j.job?.spec;
    if (!s || (!s.interactive && !(s.ports ?? []).length)) return null;
    const a = d.attempts[d.attempts.length - 1];
    const running = j.state === "running" && a && a.ended_at === null;
    const end = running && j.timeout_ms !== null ? endsIn(a.started_at + j.timeout_ms) : null;
    const ports = s.ports ?? [];
    return [
      h("dt", {}, "Class"), h("dd", { "data-testid": "run-class" }, s.interactive ? `interactive session${end ? ` · ${end}` : ""}` : "batch"),
      s.interactive && running && [h("dt", {}, "Attach"), h("dd", {}, attachBox(backend, j.id, host))],
      ports.length > 0 && [h("dt", {}, "Ports"), h("dd", {}, running ? openButtons(backend, j.id, ports, (m) => { problem.textContent = m; problem.hidden = false; }) : ports.join(", "))],
    ];
  }

  function render(d: JobDetail) {
    const j = d.job;
    const s = j.job?.spec;
    el.replaceChildren(
      h("div", { class: "toolbar" },
        h("h2", {}, `#${j.id} ${j.name}`),
        h("span", { class: `state ${j.state}`, "data-testid": "run-state" }, stateLabel(j.state)),
        h("span", { class: "spacer" }),
        !j.spec_hidden && h("button", { "data-testid": "run-again", onclick: async () => go(`#/run/${await backend.rerun(j.id)}`) }, "Run again"),
        !FINAL_STATES.includes(j.state) && h("button", { class: "danger", onclick: () => backend.cancel(j.id) }, "Cancel")),
      problem,
      h("div", { class: "cols" },
        h("dl", { class: "facts" },
          h("dt", {}, "Owner"), h("dd", {}, j.owner),
          h("dt", {}, "Image"), h("dd", { class: "mono" }, j.image),
          h("dt", {}, "Command"), s ? h("dd", { class: "mono" }, commandText(s.command)) : h("dd", { class: "muted" }, `hidden: only ${j.owner} and root see the spec and output`),
          h("dt", {}, "Asks"), h("dd", {}, ask(j.gpus, j.gpu_memory)),
          h("dt", {}, "Priority"), h("dd", {}, String(j.priority)),
          h("dt", {}, "Submitted"), h("dd", {}, `${time(j.submitted_at)} from ${j.source}`),
          h("dt", {}, "Exit code"), h("dd", { "data-testid": "run-exit" }, j.exit_code ?? "-"),
          j.message && [h("dt", {}, "Message"), h("dd", {}, j.message)],
          d.reason && [h("dt", {}, "Waiting"), h("dd", {}, d.reason)],
          sessionFacts(d)),
        h("div", {},
          h("h3", {}, "Attempts"),
          h("table", { class: "grid" }, h("thead", {}, h("tr", {}, ["#", "GPUs", "Start", "Duration", "End", "Code"].map((t) => h("th", {}, t)))),
            h("tbody", {}, d.attempts.map((a) => h("tr", {},
              h("td", {}, a.n), h("td", {}, gpuList(a.gpus)), h("td", {}, time(a.started_at)),
              h("td", {}, duration((a.ended_at ?? Date.now()) - a.started_at)), h("td", {}, a.reason ?? "running"), h("td", {}, a.exit_code ?? "-"))))),
          h("h3", {}, "Events"),
          h("ul", { class: "events" }, d.events.map((e) => h("li", {}, h("span", { class: "muted" }, time(e.at)), ` ${e.from ?? "–"} → ${e.to} `, e.message ?? ""))))),
      h("h3", {}, "Efficiency"),
      efficiencyBox(d.efficiency),
      h("h3", {}, "Results"),
      h("div", { class: "results", "data-testid": "run-results-box" }, h("p", { class: "muted" }, "…")),
      h("div", { class: "metric-charts", "data-testid": "run-metric-charts" }),
      h("h3", {}, "GPU utilization"),
      h("div", { class: "chart", "data-testid": "run-chart" }),
      h("h3", {}, "Log"),
      log,
      s ? h("details", {}, h("summary", {}, "Spec"), h("pre", { class: "mono" }, JSON.stringify(s, null, 2))) : "");
    drawChart(d, el.querySelector(".chart") as HTMLElement);
    if (!j.spec_hidden) drawResults(el.querySelector(".results") as HTMLElement, el.querySelector(".metric-charts") as HTMLElement).catch((e) => { (el.querySelector(".results") as HTMLElement).textContent = `Could not read its results: ${e}`; });
    else (el.querySelector(".results") as HTMLElement).textContent = `hidden: only ${j.owner} and root see its results`;
  }

  let metricCharts: Chart[] = [];
  /** Each metric against step, attempts joined (a line where a later attempt begins). */
  async function drawResults(box: HTMLElement, charts: HTMLElement) {
    const r = await backend.jobResults(id, 1000);
    box.replaceChildren(r.metrics.length || Object.keys(r.params).length ? resultsSummary(r) : h("p", { class: "muted" }, "Nothing logged: append JSON lines to $GANTRY_METRICS, set `tensorboard:`, or log to MLflow."));
    metricCharts.forEach((c) => c.destroy());
    metricCharts = [];
    charts.replaceChildren();
    for (const m of r.metrics) {
      const xy = seriesXY(m);
      const one = h("div", { class: "chart", "data-testid": `run-metric-${m.name}`, "data-points": String(xy.x.length), "data-attempts": String(xy.attemptStarts.length) }, h("h4", {}, m.name));
      charts.append(one);
      try { const c = xyChart(one, 420, 160, [m.name]); c.setData([xy.x, xy.y as number[]]); metricCharts.push(c); } catch { /* no canvas */ }
    }
  }

  async function drawChart(d: JobDetail, box: HTMLElement) {
    const a = d.attempts[d.attempts.length - 1];
    if (!a || a.gpus.length === 0) { box.textContent = "This run used no GPU."; return; }
    const to = a.ended_at ?? Date.now();
    let data: [number[], number[], number[]];
    if (Date.now() - a.started_at < 55 * 60_000) {
      // Recent run: the engine still holds its 1 Hz samples.
      data = recentChartData(await backend.gpuRecent(a.started_at - 5_000), a.gpus, a.started_at - 5_000, to + 5_000);
    } else {
      data = runChartData(await Promise.all(a.gpus.map((g) => backend.gpuMinutes(g, a.started_at - 60_000, to + 60_000))));
    }
    if (data[0].length === 0) { box.textContent = "No GPU samples for this run."; return; }
    try { lineChart(box, 640, 160, ["utilization"]).setData([data[0], data[1]]); } catch { /* no canvas */ }
  }

  async function load() {
    host = await backend.machines().then((m) => m.current, () => null);
    const d = await backend.job(id);
    render(d);
    log.textContent = "";
    if (d.job.spec_hidden) log.textContent = "";
    else if (FINAL_STATES.includes(d.job.state)) log.textContent = await backend.logs(id);
    else stopLog = backend.followLogs(id, (t) => { log.textContent = appendLog(log.textContent ?? "", t); log.scrollTop = log.scrollHeight; });
  }
  load().catch((e) => el.append(h("p", { class: "error" }, String(e))));
  backend.onJobChanged(async (ev) => {
    if (ev.job_id !== id) return;
    const d = await backend.job(id);
    const text = log.textContent;
    render(d);
    log.textContent = text;
    if (FINAL_STATES.includes(d.job.state) && !d.job.spec_hidden) { stopLog?.(); log.textContent = await backend.logs(id); }
  }).then((u) => (unsub = u));
  return { el, dispose() { stopLog?.(); unsub?.(); metricCharts.forEach((c) => c.destroy()); } };
}
