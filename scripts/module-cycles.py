#!/usr/bin/env python3
"""Import cycles between the top-level modules of each crate.

A module is a file `src/NAME.rs` or a folder `src/NAME/`; an edge A -> B is
any `crate::B` path (in `use` lists too) in A's files, outside comments and
unit-test modules. Prints every strongly
connected group of more than one module; exits 1 if there is one.
Usage: scripts/module-cycles.py [CRATE_DIR ...]   (default: crates/*)"""
import glob, os, re, sys

def modules(src):
    mods = {}
    for p in glob.glob(os.path.join(src, "*.rs")):
        name = os.path.basename(p)[:-3]
        if name not in ("lib", "main"):
            mods[name] = [p]
    for d in glob.glob(os.path.join(src, "*/")):
        name = os.path.basename(d.rstrip("/"))
        mods.setdefault(name, []).extend(glob.glob(os.path.join(d, "**", "*.rs"), recursive=True))
    return mods

def code(path):
    """The file without comments (doc links are not imports) and without its
    unit tests (a `#[cfg(test)] mod tests` at the end: not the library's graph)."""
    text = open(path).read()
    cut = re.search(r"^#\[cfg\(test\)\]\s*\nmod tests", text, re.M)
    if cut:
        text = text[: cut.start()]
    return "\n".join(l.split("//")[0] for l in text.splitlines())

def edges(mods, root_files):
    names = set(mods)
    graph = {m: set() for m in mods}
    for m, files in mods.items():
        for f in files:
            text = code(f)
            # crate::X and `use crate::{X, Y::..}` groups
            for x in re.findall(r"crate::(\w+)", text):
                if x in names and x != m:
                    graph[m].add(x)
            for group in re.findall(r"crate::\{([^}]*)\}", text):
                for x in re.findall(r"(?:^|[,{\s])(\w+)", group):
                    if x in names and x != m:
                        graph[m].add(x)
    # In a binary, `mod` siblings reach each other through `crate::` too; a
    # bare `super::X` from a top-level file also names a sibling.
    for m, files in mods.items():
        for f in files:
            if os.path.dirname(f) == os.path.dirname(root_files[0]):
                for x in re.findall(r"super::(\w+)", code(f)):
                    if x in names and x != m:
                        graph[m].add(x)
    return graph

def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(comp)
    for v in graph:
        if v not in index: visit(v)
    return out

bad = False
crates = sys.argv[1:] or sorted(glob.glob("crates/*"))
for c in crates:
    src = os.path.join(c, "src")
    roots = [p for p in (os.path.join(src, "lib.rs"), os.path.join(src, "main.rs")) if os.path.exists(p)]
    if not roots: continue
    g = edges(modules(src), roots)
    for comp in sccs(g):
        if len(comp) > 1:
            bad = True
            pairs = sorted(f"{a} -> {b}" for a in comp for b in g[a] if b in comp)
            print(f"{c}: cycle among {sorted(comp)}: " + "; ".join(pairs))
if not bad:
    print("no import cycles between top-level modules in: " + ", ".join(crates))
sys.exit(1 if bad else 0)
