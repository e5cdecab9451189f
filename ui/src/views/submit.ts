// Submit view: drop files anywhere (or pick them), preview each parsed job or its errors, confirm.
import type { Backend } from "../backend";
import { h, clear, type View } from "../dom";
import { ask, commandText, time } from "../format";
import type { Preview } from "../types";

/** The dry run's answer for a file: where its job(s) would start now, or why they would wait. */
export function planText(p: Preview): string {
  const jobs = p.plan?.jobs ?? [];
  if (!jobs.length) return "";
  const one = (j: (typeof jobs)[number]) =>
    j.starts_now
      ? j.gpus.length ? `would start now on GPU ${j.gpus.join(",")}` : "would start now"
      : `would wait: ${j.reason ?? "the queue"}${j.estimated_start ? ` · starts about ${time(j.estimated_start)}` : ""}`;
  if (jobs.length === 1) return one(jobs[0]);
  const now = jobs.filter((j) => j.starts_now).length;
  return `${jobs.length} jobs: ${now} would start now${now < jobs.length ? `; ${one(jobs.find((j) => !j.starts_now)!)}` : ""}`;
}

export function errorText(p: Preview): string {
  const e = p.spec_error;
  if (!e) return p.error ?? "";
  const where = e.line ? `line ${e.line}${e.column ? `, column ${e.column}` : ""}: ` : "";
  return `${where}${e.message}${e.hint ? `\nfix: ${e.hint}` : ""}`;
}

export interface SubmitView extends View {
  /** The one path every submission takes: drop event, file picker, and tests. */
  handleFiles(paths: string[]): Promise<void>;
}

export function submitView(backend: Backend, go: (hash: string) => void): SubmitView {
  const el = h("section", { class: "view", "data-testid": "view-submit" });
  const list = h("div", { class: "previews", "data-testid": "previews" });
  const confirm = h("button", { class: "primary", disabled: true, "data-testid": "submit-confirm" }, "Submit");
  const result = h("div", { "data-testid": "submit-result" });
  const inbox = h("code", { "data-testid": "inbox-path" }, "…");
  let previews: Preview[] = [];

  el.append(
    h("div", { class: "toolbar" }, h("h2", {}, "Submit")),
    h("div", { class: "dropzone" },
      h("p", {}, "Drop job spec files (.yaml, .toml) anywhere on this window, or ",
        h("button", { "data-testid": "pick-files", onclick: async () => { const p = await backend.pickFiles(); if (p.length) await view.handleFiles(p); } }, "choose files…")),
      h("p", { class: "muted" }, "Drop folder: ", inbox, " ", h("button", { onclick: () => backend.openInbox() }, "Open folder"))),
    list,
    h("div", { class: "toolbar" }, confirm, result));

  backend.status().then((s) => (inbox.textContent = s.inbox)).catch(() => {});

  function renderPreviews() {
    clear(list);
    for (const p of previews) {
      if (p.job) {
        const j = p.job;
        list.append(h("article", { class: "card ok", "data-testid": "preview-ok" },
          h("header", {}, h("strong", {}, j.name), h("span", { class: "muted" }, p.file_name)),
          h("div", { class: "mono" }, j.spec.image), h("div", { class: "mono" }, commandText(j.spec.command)),
          h("div", {}, `${ask(j.gpus, j.gpu_memory)} · priority ${j.spec.priority}${j.spec.timeout ? ` · timeout ${j.spec.timeout}` : ""}`),
          p.plan ? h("div", { class: "muted", "data-testid": "preview-plan" }, planText(p)) : ""));
      } else {
        list.append(h("article", { class: "card bad", "data-testid": "preview-error" },
          // A spec error makes it invalid; a valid spec the engine's dry run refuses (the lab's limits,
          // a mount you may not read, the queued-jobs cap) is refused: either way it is not submitted.
          h("header", {}, h("strong", {}, p.file_name), h("span", { class: "state failed", "data-testid": "preview-verdict" }, p.spec_error ? "invalid" : "refused")),
          h("pre", { class: "error" }, errorText(p))));
      }
    }
    const ok = previews.filter((p) => p.job).length;
    (confirm as HTMLButtonElement).disabled = ok === 0;
    confirm.textContent = ok === 1 ? "Submit 1 job" : `Submit ${ok} jobs`;
  }

  confirm.addEventListener("click", async () => {
    const paths = previews.filter((p) => p.job).map((p) => p.path);
    const res = await backend.submitPaths(paths);
    clear(result);
    const ids: number[] = [];
    res.forEach((r, i) => {
      if ("Ok" in r) ids.push(...r.Ok);
      else result.append(h("p", { class: "error" }, `${paths[i]}: ${r.Err}`));
    });
    ids.forEach((id) => result.append(h("a", { href: `#/run/${id}`, "data-testid": "submitted-job", "data-job": id }, `job #${id}`), " "));
    previews = [];
    renderPreviews();
    if (ids.length === 1) go(`#/run/${ids[0]}`);
  });

  const view: SubmitView = {
    el,
    dispose() {},
    async handleFiles(paths: string[]) {
      clear(result);
      previews = await backend.previewPaths(paths);
      renderPreviews();
    },
  };
  return view;
}
