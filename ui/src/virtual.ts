// Virtual scrolling math for the history table: which rows to render, which pages to fetch.

export interface Slice { first: number; last: number; padTop: number; padBottom: number }

export function visibleSlice(scrollTop: number, viewport: number, rowHeight: number, total: number, overscan = 10): Slice {
  if (total <= 0) return { first: 0, last: -1, padTop: 0, padBottom: 0 };
  const first = Math.max(0, Math.floor(scrollTop / rowHeight) - overscan);
  const last = Math.min(total - 1, Math.ceil((scrollTop + viewport) / rowHeight) + overscan);
  return { first, last, padTop: first * rowHeight, padBottom: (total - 1 - last) * rowHeight };
}

export function pagesFor(first: number, last: number, pageSize: number): number[] {
  if (last < first) return [];
  const out: number[] = [];
  for (let p = Math.floor(first / pageSize); p <= Math.floor(last / pageSize); p++) out.push(p);
  return out;
}

/** Timeline lanes: x position and width (px) of a run inside [from, to]. */
export function laneBox(start: number, end: number | null, from: number, to: number, width: number, now: number): { x: number; w: number } | null {
  const e = end ?? now;
  if (e < from || start > to) return null;
  const s = Math.max(start, from);
  const scale = width / (to - from);
  return { x: (s - from) * scale, w: Math.max(1, (Math.min(e, to) - s) * scale) };
}
