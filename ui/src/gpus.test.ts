// The GPUs view's idle cost: what it redraws, how often, and that it stops while the window is hidden.
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";

const draws: number[] = []; // chart index per setData
let made = 0;
vi.mock("./charts", () => ({ lineChart: () => { const i = made++; return { setData() { draws.push(i); }, destroy() {} }; } }));
import { fakeBackend, gpu } from "./fake-backend";
import { gpuSeries, steadyKey } from "./series";
import type { GpuSample } from "./types";
import { gpusView, REDRAW_MS } from "./views/gpus";

/** IntersectionObserver stand-in: the test says which cards are on screen. */
let io: { cb: (e: { target: Element; isIntersecting: boolean }[]) => void; els: Element[] } | null = null;
class FakeIO { constructor(cb: any) { io = { cb, els: [] }; } observe(el: Element) { io!.els.push(el); } disconnect() {} }
const show = (cards: number[], on = true) => io!.cb(cards.map((i) => ({ target: io!.els[i], isIntersecting: on })));

let hidden = false;
beforeEach(() => {
  vi.useFakeTimers({ now: 1_000_000_000_000 });
  vi.stubGlobal("IntersectionObserver", FakeIO);
  Object.defineProperty(document, "hidden", { configurable: true, get: () => hidden });
  draws.length = 0;
  made = 0;
  hidden = false;
});
afterEach(() => { vi.useRealTimers(); vi.unstubAllGlobals(); });

function eightGpus() {
  let onSample: ((at: number, g: GpuSample[]) => void) | null = null;
  let streams = 0, stopped = 0;
  const gpus = Array.from({ length: 8 }, (_, i) => gpu(i));
  const { b, calls } = fakeBackend({
    gpus: () => Promise.resolve({ backend: "simulated", note: null, gpus, holders: [], reserved: [], users: [], library: null }),
    gpuRecent: (since) => { calls.push({ name: "gpuRecent", args: [since] }); return Promise.resolve([]); },
    watchGpus: (cb) => { streams++; onSample = cb; return () => { stopped++; onSample = null; }; },
  });
  const sample = (util = (_i: number) => 50) => onSample?.(Date.now(), gpus.map((g, i) => ({ ...g, utilization: util(i) })));
  return { b, calls, sample, streams: () => streams, stopped: () => stopped };
}

describe("GPUs view idle cost", () => {
  it("redraws only the cards on screen, at most once per second however fast samples come", async () => {
    const f = eightGpus();
    const v = gpusView(f.b, "ada");
    await vi.advanceTimersByTimeAsync(10);
    show([0, 1, 2, 3]);
    draws.length = 0;
    for (let i = 0; i < 200; i++) { await vi.advanceTimersByTimeAsync(10); f.sample(); } // 100 Hz for 2 s
    await vi.advanceTimersByTimeAsync(REDRAW_MS);
    // 200 samples in 2 s, then 1 s more: each card on screen drawn 3 times (once a second), none off screen.
    expect([...draws].sort()).toEqual([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
    // A card scrolled into view is drawn at once; one scrolled out is not drawn again.
    draws.length = 0;
    show([6]);
    show([0], false);
    expect(draws).toEqual([6]);
    f.sample();
    await vi.advanceTimersByTimeAsync(REDRAW_MS);
    expect([...draws].sort()).toEqual([1, 2, 3, 6, 6]);
    v.dispose();
    expect(f.stopped()).toBe(1);
  });

  it("stops streaming and drawing while the window is hidden, then fetches only the samples it missed", async () => {
    const f = eightGpus();
    const v = gpusView(f.b, "ada");
    await vi.advanceTimersByTimeAsync(10);
    show([0, 1]);
    f.sample();
    await vi.advanceTimersByTimeAsync(REDRAW_MS);
    const seen = gpuSeries.last;
    hidden = true;
    document.dispatchEvent(new Event("visibilitychange"));
    expect(f.stopped()).toBe(1);
    draws.length = 0;
    f.sample(); // a sample in flight after the stop is not drawn
    await vi.advanceTimersByTimeAsync(60_000);
    expect(draws).toEqual([]);
    hidden = false;
    document.dispatchEvent(new Event("visibilitychange"));
    await vi.advanceTimersByTimeAsync(REDRAW_MS);
    expect(f.streams()).toBe(2);
    const recent = f.calls.filter((c) => c.name === "gpuRecent").map((c) => c.args[0]);
    expect(recent[recent.length - 1]).toBe(seen + 1);
    expect(draws.length).toBeGreaterThan(0);
    v.dispose();
  });
});

describe("steady charts are not redrawn", () => {
  it("once a GPU's line is flat across the window it is not redrawn; a busy GPU's chart keeps moving", async () => {
    vi.setSystemTime(2_000_000_000_000); // newer than the shared series' samples from other tests
    const f = eightGpus();
    const v = gpusView(f.b, "ada");
    await vi.advanceTimersByTimeAsync(10);
    show([0, 1]);
    // GPU 0 idle (0%), GPU 1 busy with a changing load, 1 Hz for 6 minutes (the window is 5).
    for (let s = 0; s < 360; s++) { f.sample((i) => (i === 1 ? 60 + (s % 7) : 0)); await vi.advanceTimersByTimeAsync(1000); }
    draws.length = 0;
    for (let s = 0; s < 10; s++) { f.sample((i) => (i === 1 ? 60 + (s % 7) : 0)); await vi.advanceTimersByTimeAsync(1000); }
    expect(draws.filter((i) => i === 0)).toEqual([]);
    expect(draws.filter((i) => i === 1).length).toBeGreaterThanOrEqual(9);
    // The idle GPU gets work: its chart moves again at once.
    draws.length = 0;
    f.sample(() => 95);
    await vi.advanceTimersByTimeAsync(REDRAW_MS);
    expect(draws.filter((i) => i === 0)).toEqual([0]);
    v.dispose();
  });

  // 5-minute window ending now (seconds), one sample per second.
  const now = 10_000, from = now - 300;
  const flat = (u: number, m: number, start = from): [number[], number[], number[]] => {
    const ts: number[] = [];
    for (let t = start; t <= now; t++) ts.push(t);
    return [ts, ts.map(() => u), ts.map(() => m)];
  };
  it("a flat line over the whole window has a key, the same a second later", () => {
    const k = steadyKey(flat(0, 0), from, now, 5);
    expect(k).not.toBeNull();
    expect(steadyKey(flat(0, 0, from + 1).map((a, i) => (i === 0 ? a.map((t) => t + 1) : a)) as any, from + 1, now + 1, 5)).toBe(k);
  });
  it("a change of level, window or any point means a redraw", () => {
    const k = steadyKey(flat(0, 0), from, now, 5);
    expect(steadyKey(flat(90, 70), from, now, 5)).not.toBe(k);
    expect(steadyKey(flat(0, 0), from, now, 15)).not.toBe(k);
    const bump = flat(0, 0);
    bump[1][100] = 5;
    expect(steadyKey(bump, from, now, 5)).toBeNull();
  });
  it("a line that does not reach the left edge yet, or stopped getting samples, moves", () => {
    expect(steadyKey(flat(0, 0, from + 60), from, now, 5)).toBeNull();
    expect(steadyKey(flat(0, 0), from + 10, now + 10, 5)).toBeNull();
    expect(steadyKey([[], [], []], from, now, 5)).toBeNull();
  });
});
