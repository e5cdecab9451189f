#!/usr/bin/env python3
"""Compare `gantry sim` with and without preemption seed by seed (issue 32).

For each trace: the plain gantry row over N seeds (cached beside the trace as .base-N.json), then the
gantry+preempt row, and prints on how many seeds the allocated share while jobs wait is lower with
preemption (and the worst seed), the same for makespan, the mean of the other figures, and each
user's mean wait with preemption against without. Traces named *lab-week* run on 4x24GiB; the others on
8x32GiB at load 1.2 (the guide's settings). Extra arguments after `--` go to both runs.

    scripts/preempt-compare.py --gantry target/release/gantry --seeds 10 traces/lab-week.csv /tmp/share5-s0.csv
"""
import argparse, json, os, subprocess, statistics as st, sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gantry", default="target/release/gantry")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--label", default="gantry+preempt")
    ap.add_argument("traces", nargs="+")
    a, extra = ap.parse_known_args()
    extra = [x for x in extra if x != "--"]

    def run(t, more):
        gpus = ["--gpus", "4x24GiB"] if "lab-week" in t else ["--gpus", "8x32GiB", "--load", "1.2"]
        cmd = [a.gantry, "sim", "--trace", t, *gpus, "--seeds", str(a.seeds), "--policy", "gantry", "--json", *extra, *more]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"{' '.join(cmd)}: {out.stderr}")
        return json.loads(out.stdout)

    for t in a.traces:
        name = os.path.basename(t).removesuffix(".csv")
        cache = f"{t}.base-{a.seeds}.json"
        if not os.path.exists(cache):
            json.dump(run(t, []), open(cache, "w"))
        b = next(r for r in json.load(open(cache)) if r["policy"] == "gantry")
        p = next(r for r in run(t, ["--preempt", "--preempt-only"]) if r["policy"] == "gantry+preempt")
        n = len(b["alloc_share_while_waiting"])
        ba, pa = b["alloc_share_while_waiting"], p["alloc_share_while_waiting"]
        lower = sum(pa[i] < ba[i] - 1e-12 for i in range(n))
        longer = sum(p["makespan_ratio"][i] > b["makespan_ratio"][i] + 1e-12 for i in range(n))
        worst = min(pa[i] - ba[i] for i in range(n))
        m = lambda v: st.mean(v) if v else float("nan")
        users = []
        for u in sorted(b["mean_wait_by_user"][0]):
            bw = m([s.get(u, 0) for s in b["mean_wait_by_user"]])
            pw = m([s.get(u, 0) for s in p["mean_wait_by_user"]])
            users.append(f"{u} {100 * (pw - bw) / bw:+.1f}%" if bw else f"{u} -")
        print(
            f"{a.label:<16} {name:<24} alloc {100 * m(ba):.1f}->{100 * m(pa):.1f} lower {lower}/{n} (worst {100 * worst:+.2f})"
            f" | xLB {m(b['makespan_ratio']):.3f}->{m(p['makespan_ratio']):.3f} longer {longer}/{n}"
            f" | w/fifo {m(b['wait_over_fifo']):.3f}->{m(p['wait_over_fifo']):.3f}"
            f" | big/1 {m(b['big_over_one']):.2f}->{m(p['big_over_one']):.2f}"
            f" | pre {m(p['preemptions']):.0f} lost {100 * m(p['lost_share']):.2f}% | {', '.join(users)}",
            flush=True,
        )


main()
