#!/usr/bin/env python3
"""Sharing-heavy traces for `gantry sim` (issue 32), built from the public Alibaba trace's shapes.

Takes a window of `--jobs` consecutive GPU tasks of the Alibaba trace (arrival times and durations
as recorded, from `--offset`), keeps each task's GPU count, and makes `--share` of all jobs declare
`gpu_memory` (1-GPU tasks only: a task whose `gpu_milli` is already a share keeps it, a whole-GPU task
chosen to share gets a share drawn from the trace's own `gpu_milli` shares), written as the sim's
Gantry CSV takes it: thousandths of a GPU. Jobs are spread over four users by a seeded draw (40/30/20/10 %),
so per-user waits can be compared. Deterministic for a given `--seed`.

`--notebooks F` turns a share F of the sharing jobs into notebooks (a lab's interactive work: one GPU, a
small share of it, 10-25%, open for 2 to 10 hours), replacing their recorded share and duration.

    python3 scripts/sharing-trace.py --share 0.7 --seed 1 > /tmp/share70-s1.csv
    gantry sim --trace /tmp/share70-s1.csv --gpus 8x32GiB --load 1.2 --policy gantry --preempt
"""

import argparse
import csv
import random
import sys

USERS = [("ana", 0.4), ("ben", 0.3), ("cho", 0.2), ("dia", 0.1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="/work/shared/traces/alibaba-openb-pod-list-default.csv")
    ap.add_argument("--jobs", type=int, default=1500)
    ap.add_argument("--offset", type=int, default=2000, help="first GPU task of the window")
    ap.add_argument("--share", type=float, default=0.7, help="share of jobs that declare gpu_memory (0.5-0.9)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--notebooks", type=float, default=0.0, help="share of the sharing jobs that are notebooks (0-1)")
    a = ap.parse_args()
    if not 0.0 <= a.share <= 1.0:
        sys.exit("--share is a fraction from 0 to 1, e.g. 0.7")
    rows = [r for r in csv.DictReader(open(a.trace)) if int(r["num_gpu"]) > 0]
    rows.sort(key=lambda r: (int(r["creation_time"]), r["name"]))
    window = rows[a.offset : a.offset + a.jobs]
    if len(window) < a.jobs:
        sys.exit(f"the trace has {len(rows)} GPU tasks; --offset {a.offset} + --jobs {a.jobs} is past its end")
    shares = [int(r["gpu_milli"]) for r in rows if r["num_gpu"] == "1" and 0 < int(r["gpu_milli"]) < 1000]
    rng = random.Random(a.seed)
    ones = [i for i, r in enumerate(window) if r["num_gpu"] == "1"]
    want = min(len(ones), round(a.share * len(window)))
    # Tasks that already share come first (as recorded), then whole-GPU 1-GPU tasks drawn at random.
    already = [i for i in ones if 0 < int(window[i]["gpu_milli"]) < 1000]
    rest = [i for i in ones if i not in set(already)]
    rng.shuffle(already)
    rng.shuffle(rest)
    sharing = set((already + rest)[:want])
    t0 = int(window[0]["creation_time"])
    out = csv.writer(sys.stdout, lineterminator="\n")
    print(
        f"# Sharing-heavy trace (scripts/sharing-trace.py --jobs {a.jobs} --offset {a.offset} --share {a.share}"
        f" --seed {a.seed} --notebooks {a.notebooks})"
    )
    out.writerow(["submit_s", "duration_s", "gpus", "gpu_memory", "user", "priority"])
    for i, r in enumerate(window):
        dur = max(1, int(r["deletion_time"]) - int(r["creation_time"]))
        mem = ""
        if i in sharing:
            milli = int(r["gpu_milli"])
            if not 0 < milli < 1000:
                milli = rng.choice(shares)
            mem = str(milli)
            if a.notebooks > 0 and rng.random() < a.notebooks:
                mem = str(rng.choice([100, 150, 200, 250]))
                dur = rng.randint(2 * 3600, 10 * 3600)
        u = rng.random()
        acc = 0.0
        user = USERS[-1][0]
        for name, w in USERS:
            acc += w
            if u < acc:
                user = name
                break
        out.writerow([int(r["creation_time"]) - t0, dur, r["num_gpu"], mem, user, 0])


if __name__ == "__main__":
    main()
