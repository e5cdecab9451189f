import { describe, expect, it } from "vitest";
import { booking, bookings, fakeBackend, gpu, settle } from "./fake-backend";
import { HOUR_MS, bookingsView, layoutBookings, slotFloor, slotFromDrag, slotPx } from "./views/bookings";

const T0 = 20_000 * 86_400_000; // a midnight UTC

describe("bookings timeline logic", () => {
  it("floors to the lab's slots, counted from midnight UTC", () => {
    expect(slotFloor(T0 + 5 * HOUR_MS + 1234, HOUR_MS)).toBe(T0 + 5 * HOUR_MS);
    expect(slotFloor(T0 + 5 * HOUR_MS + 31 * 60_000, 30 * 60_000)).toBe(T0 + 5.5 * HOUR_MS);
    expect(slotFloor(T0, HOUR_MS)).toBe(T0);
    expect([slotPx(HOUR_MS), slotPx(30 * 60_000), slotPx(5 * 60_000)]).toEqual([28, 14, 10]);
  });
  it("turns a drag, either way, into the whole slots it covers, within the picture", () => {
    const px = 28, slots = 48;
    expect(slotFromDrag(60, 150, T0, HOUR_MS, px, slots)).toEqual({ start_ms: T0 + 2 * HOUR_MS, end_ms: T0 + 6 * HOUR_MS });
    expect(slotFromDrag(150, 60, T0, HOUR_MS, px, slots)).toEqual({ start_ms: T0 + 2 * HOUR_MS, end_ms: T0 + 6 * HOUR_MS });
    // A click is one slot.
    expect(slotFromDrag(30, 30, T0, HOUR_MS, px, slots)).toEqual({ start_ms: T0 + HOUR_MS, end_ms: T0 + 2 * HOUR_MS });
    // Past either edge: clamped.
    expect(slotFromDrag(-40, 10_000, T0, HOUR_MS, px, slots)).toEqual({ start_ms: T0, end_ms: T0 + 48 * HOUR_MS });
  });
  it("lays bookings on GPU rows: active ones where they are, others on the first free rows of their type", () => {
    const gpus = [gpu(0, { name: "NVIDIA A100" }), gpu(1, { name: "NVIDIA A100" }), gpu(2, { name: "NVIDIA H100" })];
    const list = [
      booking(1, T0, 4, { state: "active", gpu_indices: [1] }),
      booking(2, T0 + HOUR_MS, 2, { gpus: 2, owner: "bob", mine: false }),
      booking(3, T0 + 2 * HOUR_MS, 2, { gpu_type: "h100" }),
      booking(4, T0 + 5 * HOUR_MS, 1),
      booking(5, T0, 1, { state: "cancelled" }),
      booking(6, T0 + HOUR_MS, 1, { gpu_type: "A100" }),
    ];
    const got = layoutBookings(list, gpus).map((p) => [p.booking.id, p.rows, p.crowded]);
    expect(got).toEqual([
      [1, [1], false],
      [2, [0, 2], false],
      // Both A100s are taken then (1 active, 0 by bob's): drawn over one, marked crowded.
      [6, [0], true],
      [3, [2], true],
      [4, [0], false],
    ]);
  });
});

describe("bookings view", () => {
  it("draws mine highlighted, lists open ones with cancel on mine, and states the lab's rules", async () => {
    const now = Date.now();
    const start = slotFloor(now, HOUR_MS) + 2 * HOUR_MS;
    const list = [booking(7, start, 3, { note: "demo" }), booking(8, start + 5 * HOUR_MS, 1, { owner: "bob", uid: 1001, mine: false })];
    const { b, calls } = fakeBackend({ bookings: () => Promise.resolve(bookings(list, now)) });
    const v = bookingsView(b);
    await settle(10);
    expect(v.el.querySelector("[data-testid=bookings-rules]")!.textContent).toBe(
      "Slots of 60 min · up to 14 days ahead · at most 24 h long · at most 4 GPUs a booking · 40 GPU-hours a week each · released when unused 30 min after its start");
    const mine = v.el.querySelector("[data-testid=tl-booking-7-0]") as HTMLElement;
    expect(mine.className).toContain("mine");
    expect(mine.textContent).toBe("mine: demo");
    expect(mine.style.left).toBe(`${2 * 28}px`);
    expect(mine.style.width).toBe(`${3 * 28}px`);
    expect(v.el.querySelector("[data-testid=tl-booking-8-0]")!.className).not.toContain("mine");
    expect(v.el.querySelector("[data-testid=cancel-booking-8]")).toBeNull();
    (v.el.querySelector("[data-testid=cancel-booking-7]") as HTMLButtonElement).click();
    await settle();
    expect(calls.filter((c) => c.name === "cancelBooking").map((c) => c.args[0])).toEqual([7]);
    v.dispose();
  });
  it("books the slot dragged across a GPU row with the form's GPUs and note", async () => {
    const now = Date.now();
    const { b, calls } = fakeBackend({ bookings: () => Promise.resolve(bookings([], now)) });
    const v = bookingsView(b);
    document.body.append(v.el);
    await settle(10);
    const row = v.el.querySelector("[data-testid=tl-row-1]") as HTMLElement;
    const left = row.getBoundingClientRect().left;
    row.dispatchEvent(new MouseEvent("mousedown", { clientX: left + 3 * 28 + 5, button: 0, bubbles: true }));
    row.dispatchEvent(new MouseEvent("mousemove", { clientX: left + 6 * 28 + 5, bubbles: true }));
    row.dispatchEvent(new MouseEvent("mouseup", { clientX: left + 6 * 28 + 5, bubbles: true }));
    expect((v.el.querySelector("[data-testid=book-form]") as HTMLElement).hidden).toBe(false);
    (v.el.querySelector("[data-testid=book-gpus]") as HTMLInputElement).value = "2";
    (v.el.querySelector("[data-testid=book-note]") as HTMLInputElement).value = "demo at 14:00";
    v.el.querySelector("[data-testid=book-form] form")!.dispatchEvent(new Event("submit", { cancelable: true }));
    await settle();
    const origin = slotFloor(now, HOUR_MS);
    expect(calls.filter((c) => c.name === "book").map((c) => c.args[0])).toEqual([
      { gpus: 2, gpu_type: null, start_ms: origin + 3 * HOUR_MS, end_ms: origin + 7 * HOUR_MS, note: "demo at 14:00" }]);
    v.dispose();
    v.el.remove();
  });
  it("shows the engine's refusal (the lab's limits) in the form", async () => {
    const { b } = fakeBackend({ book: () => Promise.reject("this booking would bring your week to 44 GPU-hours; the lab allows 40") });
    const v = bookingsView(b);
    document.body.append(v.el);
    await settle(10);
    const row = v.el.querySelector("[data-testid=tl-row-0]") as HTMLElement;
    row.dispatchEvent(new MouseEvent("mousedown", { clientX: 40, button: 0, bubbles: true }));
    row.dispatchEvent(new MouseEvent("mouseup", { clientX: 40, bubbles: true }));
    v.el.querySelector("[data-testid=book-form] form")!.dispatchEvent(new Event("submit", { cancelable: true }));
    await settle();
    expect(v.el.querySelector("[data-testid=book-form] .error")!.textContent).toBe("this booking would bring your week to 44 GPU-hours; the lab allows 40");
    v.dispose();
    v.el.remove();
  });
});
