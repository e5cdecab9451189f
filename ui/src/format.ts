// Pure formatting helpers (tested).

export function bytes(b: number | null | undefined): string {
  if (b === null || b === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = b;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i === 0 ? `${b} B` : `${v.toFixed(1)} ${units[i]}`;
}

/** 93784000 ms -> "1d 2h 3m" (two most significant units). */
export function duration(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || ms < 0) return "-";
  const s = Math.floor(ms / 1000);
  const parts: [number, string][] = [[Math.floor(s / 86400), "d"], [Math.floor(s / 3600) % 24, "h"], [Math.floor(s / 60) % 60, "m"], [s % 60, "s"]];
  const first = parts.findIndex(([v]) => v > 0);
  if (first < 0) return "0s";
  return parts.slice(first, first + 2).filter(([v]) => v > 0).map(([v, u]) => `${v}${u}`).join(" ");
}

export function gpuHours(gpus: number, start: number | null, end: number | null): number {
  if (start === null || end === null) return 0;
  return (gpus * Math.max(0, end - start)) / 3_600_000;
}

export function time(ms: number | null | undefined): string {
  if (!ms) return "-";
  const d = new Date(ms);
  const pad = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function ask(gpus: number, mem?: number | null): string {
  if (gpus === 0) return "CPU only";
  return mem ? `${gpus} × ${bytes(mem)}` : `${gpus} GPU${gpus === 1 ? "" : "s"}`;
}

export function stateLabel(s: string): string {
  return s === "timed_out" ? "timed out" : s;
}

export function commandText(c: string | string[] | null | undefined): string {
  if (c === undefined || c === null) return "(image default)";
  return Array.isArray(c) ? c.map((a) => (/\s/.test(a) ? JSON.stringify(a) : a)).join(" ") : c;
}

/** A followed log with its next chunk: a last line ending in "\r" is a progress bar's current state
 *  (`logs -f` sends it so), drawn over by what follows, as on the job's own terminal. */
export function appendLog(text: string, chunk: string): string {
  const t = text.endsWith("\r") ? text.slice(0, text.lastIndexOf("\n") + 1) : text;
  return t + chunk;
}
