// Compare view (#/compare/ids/1,2,3 or #/compare/name/NAME): runs side by side (issue 30 item 2).
// The rows best first with the best marked, the params table with differences highlighted, every
// metric's curves overlaid, and, for a sweep, each varied param plotted against the chosen metric.
import type { Backend } from "../backend";
import { xyChart, type Chart } from "../charts";
import { h, type View } from "../dom";
import { duration, stateLabel } from "../format";
import { fmtNum, metricNames, overlay, paramPoints, paramsTable, sweepRanking } from "../results-data";
import type { CompareQuery, Comparison, Goal, JobResults } from "../types";

/** The query a compare route asks: `ids/1,2,3` or `name/NAME`. */
export function compareQuery(arg: string): CompareQuery {
  const [kind, ...rest] = arg.split("/");
  const v = decodeURIComponent(rest.join("/"));
  return kind === "name" ? { name: v } : { ids: v };
}

export function compareView(backend: Backend, arg: string, go: (hash: string) => void): View {
  const el = h("section", { class: "view compare", "data-testid": "view-compare" });
  const q = compareQuery(arg);
  let charts: Chart[] = [];
  let metric: string | null = null;
  let c: Comparison | null = null;
  let results = new Map<number, JobResults>();
  const pick = h("select", { "aria-label": "Metric", "data-testid": "compare-metric" });
  pick.addEventListener("change", () => { metric = pick.value; render(); });

  function goalOf(name: string): Goal {
    return c?.metrics.find((m) => m.name === name)?.goal ?? "max";
  }

  function render() {
    if (!c) return;
    charts.forEach((ch) => ch.destroy());
    charts = [];
    const m = metric ?? c.sort?.name ?? c.metrics[0]?.name ?? null;
    const ranked = m ? sweepRanking(c.rows, m, goalOf(m)) : { rows: c.rows, best: null };
    const rowsTable = h("table", { class: "grid", "data-testid": "compare-rows" },
      h("thead", {}, h("tr", {}, h("th", {}, "#"), h("th", {}, "Name"), h("th", {}, "State"), c.differing.map((p) => h("th", { class: "differs" }, p)),
        c.metrics.map((mm) => h("th", { class: mm.name === m ? "sorted" : "" }, `${mm.name} (${mm.goal})`)), h("th", {}, "Duration"), h("th", {}, "GPU-h"))),
      h("tbody", {}, ranked.rows.map((r) => h("tr", { class: r.job_id === ranked.best ? "best" : "", "data-testid": `compare-row-${r.job_id}`, onclick: () => go(`#/run/${r.job_id}`) },
        h("td", {}, r.job_id === ranked.best ? `★ ${r.job_id}` : String(r.job_id)), h("td", {}, r.name), h("td", {}, h("span", { class: `state ${r.state}` }, stateLabel(r.state))),
        c!.differing.map((p) => h("td", { class: "mono differs" }, r.hidden ? "hidden" : r.params[p] ?? "–")),
        c!.metrics.map((mm) => h("td", { class: "num" }, r.hidden ? "hidden" : fmtNum(r.last[mm.name]))),
        h("td", {}, duration(r.duration_ms)), h("td", { class: "num" }, r.gpu_hours.toFixed(2))))));
    const params = paramsTable(c);
    const paramsEl = h("table", { class: "grid", "data-testid": "compare-params" },
      h("thead", {}, h("tr", {}, h("th", {}, "Param"), c.rows.map((r) => h("th", {}, `#${r.job_id}`)))),
      h("tbody", {}, params.map((p) => h("tr", { class: p.differs ? "differs" : "", "data-differs": String(p.differs) }, h("td", { class: "mono" }, p.name), p.values.map((v) => h("td", { class: "mono" }, v))))));
    pick.replaceChildren(...c.metrics.map((mm) => h("option", { value: mm.name, selected: mm.name === m }, mm.name)));
    const curves = h("div", { class: "metric-charts", "data-testid": "compare-curves" });
    const names = metricNames([...results.values()]);
    const width = Math.max(320, Math.min(640, (el.clientWidth || 900) / 2 - 24));
    for (const name of names) {
      const o = overlay(c.rows.filter((r) => !r.hidden).map((r) => ({ label: `#${r.job_id}`, series: results.get(r.job_id)?.metrics.find((s) => s.name === name) })));
      const box = h("div", { class: "chart", "data-testid": `compare-curve-${name}`, "data-runs": String(o.labels.length), "data-points": String(o.data[0].length) }, h("h4", {}, name));
      curves.append(box);
      try { const ch = xyChart(box, width, 180, o.labels); ch.setData(o.data as [number[], ...number[][]]); charts.push(ch); } catch { /* no canvas */ }
    }
    const sweep = h("div", { class: "metric-charts", "data-testid": "compare-sweep" });
    if (m) {
      for (const p of c.differing) {
        const pts = paramPoints(c.rows, p, m);
        const box = h("div", { class: "chart", "data-testid": `compare-param-${p}`, "data-points": String(pts.x.length) }, h("h4", {}, `${m} by ${p}`));
        sweep.append(box);
        try { const ch = xyChart(box, width, 180, [m], { points: true, xLabels: pts.categories }); ch.setData([pts.x, pts.y]); charts.push(ch); } catch { /* no canvas */ }
      }
    }
    el.replaceChildren(
      h("div", { class: "toolbar" }, h("h2", {}, q.name ? `Compare: ${q.name}` : `Compare ${c.rows.length} runs`), h("span", { class: "spacer" }), h("label", {}, "Sort by ", pick)),
      c.rows.length ? rowsTable : h("p", { class: "muted" }, "No runs to compare."),
      h("h3", {}, "Params"), params.length ? paramsEl : h("p", { class: "muted" }, "No params (a matrix's values and MLflow's log_param are params)."),
      h("h3", {}, "Curves"), names.length ? curves : h("p", { class: "muted" }, "No metrics logged."),
      c.differing.length && m ? h("h3", {}, `Each varied param against ${m}`) : "",
      c.differing.length && m ? sweep : "");
  }

  async function load() {
    c = await backend.compare(q);
    const visible = c.rows.filter((r) => !r.hidden);
    const all = await Promise.all(visible.map((r) => backend.jobResults(r.job_id, 500).then((x) => [r.job_id, x] as const, () => null)));
    results = new Map(all.filter((x): x is readonly [number, JobResults] => x !== null));
    render();
  }
  load().catch((e) => el.replaceChildren(h("p", { class: "error" }, `Could not compare: ${e}`)));
  return { el, dispose() { charts.forEach((ch) => ch.destroy()); } };
}
