#!/usr/bin/env python3
"""Import cycles between the source files of one Rust crate (file level, `crate::` and `super::` paths,
test modules and #[cfg(test)] blocks excluded; a file may use its parent folder's module). Prints each
cycle with the edges inside it (file -> file: the names used); exit 1 if any.
Usage: scripts/check-cycles.py SRC_DIR   (run by .ci/run on crates/gantry-core/src)"""
import os, re, sys
src = sys.argv[1]
files = {}
for root, _, names in os.walk(src):
    for n in names:
        if not n.endswith(".rs"): continue
        p = os.path.join(root, n); rel = os.path.relpath(p, src)[:-3].split(os.sep)
        if rel[-1] in ("mod", "lib", "main"): rel = rel[:-1]
        if rel and rel[-1] == "tests": continue
        files[tuple(rel)] = p
def strip_tests(text):
    out, skip, depth = [], False, 0
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        l = lines[i]
        if re.match(r"\s*#\[cfg\(test\)\]", l):
            # skip the next item (a mod block or a fn) by brace counting
            j = i + 1; d = 0; started = False
            while j < len(lines):
                d += lines[j].count("{") - lines[j].count("}")
                if "{" in lines[j]: started = True
                if started and d <= 0: break
                if not started and lines[j].rstrip().endswith(";"): break
                j += 1
            i = j + 1; continue
        out.append(l); i += 1
    return "\n".join(out)
def resolve(path):
    path = tuple(path)
    while path and path not in files: path = path[:-1]
    return path if path else None
edges = {m: set() for m in files}
why = {}
for mod, p in files.items():
    text = strip_tests(open(p, encoding="utf-8", errors="replace").read())
    text = re.sub(r"//[^\n]*", "", text)
    for m in re.finditer(r"\bcrate((?:::[A-Za-z_][A-Za-z0-9_]*)+)", text):
        tgt = resolve(m.group(1).strip(":").split("::"))
        if tgt and tgt != mod and not (mod[:len(tgt)] == tgt): edges[mod].add(tgt); why.setdefault((mod, tgt), set()).add(m.group(1).strip(':').split('::')[-1])
    for m in re.finditer(r"\b((?:super::)+)((?:[A-Za-z_][A-Za-z0-9_]*::?)*)", text):
        ups = m.group(1).count("super")
        base = mod[:-ups] if ups <= len(mod) else ()
        # a mod.rs file is its folder: super from engine/pass.rs is engine
        rest = [x for x in m.group(2).split("::") if x]
        tgt = resolve(list(base) + rest)
        if tgt and tgt != mod and not (mod[:len(tgt)] == tgt): edges[mod].add(tgt); why.setdefault((mod, tgt), set()).add(rest[-1] if rest else "super")
# Tarjan
idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: out.append(comp)
for v in files:
    if v not in idx: sc(v)
for comp in out:
    names = sorted("/".join(x) or "lib" for x in comp)
    print(f"cycle of {len(comp)}: " + ", ".join(names))
    inside = set(comp)
    for a in sorted(inside):
        for b in sorted(edges[a] & inside):
            print(f"  {'/'.join(a) or 'lib'} -> {'/'.join(b) or 'lib'}: {', '.join(sorted(why.get((a, b), [])))}")
print(f"{len(out)} cycles among {len(files)} files")
# Layering: what each top-level module never imports (ARCHITECTURE.md's codemap says why).
LEAVES = {"units", "defaults", "shell", "clock"}
NEVER = {
    "protocol": {"engine", "store", "api", "inbox", "executor", "slurm", "daemon", "client", "policy", "config", "scheduler"},
    "spec": {"store", "engine", "scheduler", "api", "inbox", "policy", "config"},
    "scheduler": {"engine", "store", "api", "inbox", "executor", "slurm", "daemon", "client", "policy", "config"},
    "estimate": {"store", "engine"},
    "store": {"engine", "api", "inbox", "scheduler", "executor", "slurm"},
    "access": {"engine", "store", "api", "inbox"},
    "executor": {"engine", "api", "inbox", "daemon"},
    "slurm": {"engine", "api", "inbox", "daemon"},
    "engine": {"api", "inbox", "daemon", "client"},
    "client": {"api", "engine", "store", "inbox", "daemon", "executor", "slurm"},
}
bad = []
for a, bs in edges.items():
    for b in bs:
        ta, tb = (a[0] if a else "lib"), (b[0] if b else "lib")
        if ta == tb:
            continue
        if ta in LEAVES or tb in NEVER.get(ta, ()):
            bad.append(f"  {'/'.join(a)} -> {'/'.join(b)}: {', '.join(sorted(why.get((a, b), [])))}")
if bad:
    print("layering: imports that ARCHITECTURE.md rules out")
    print("\n".join(sorted(bad)))
print(f"{len(bad)} layering violations")
sys.exit(1 if out or bad else 0)
