#!/usr/bin/env python3
"""Import circles between the source files of each crate, and its layers.

Every `.rs` file under a crate's `src/` is a node (`src/a/b.rs` and
`src/a/b/mod.rs` are both the module `a::b`; `lib.rs` and `main.rs` are the
root). An edge A -> B is a path in A's code that reaches an item B defines:
`crate::…`, `super::…`, `self::…` and a child module's `child::…`, inside
`use` groups and globs too. A path that ends at a name a module re-exports
(`pub use x::Name`, `pub use x::*`) is followed to the file that defines
it, so a re-export does not hide a circle. A folder's `mod.rs` is a file
like the others: a child that uses an item the `mod.rs` defines, and a
`mod.rs` whose code uses a child's item (through its own re-export too),
make two edges; declaring a child (`mod x;`) and re-exporting its items
make none.

Comments, string and character literals, a trailing `#[cfg(test)] mod
tests` and unit-test files (`tests.rs`) are not read: tests may use
anything. Prints each circle (a strongly connected group of two or
more files), and each among the modules of a folder, every file below a
module collapsed to it (at the crate's root: its top-level modules, the
crate's layers; then inside every folder). Then against
docs/design/layout.md: each library crate's table of layers
(`| layer | modules of `crates/NAME` |`) must name every top-level module
and only those, each using only modules of lower layers; every source
folder must be named (`name/`) in its crate's part of the layout's tree.
Exits 1 on any of these.

Usage: scripts/module-cycles.py [CRATE_DIR ...]   (default: crates/*)"""
import glob
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_of(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return () if parts in (["lib"], ["main"]) else tuple(parts)


def code(path):
    """The file's text without comments, string contents and unit tests."""
    text = open(path, encoding="utf-8").read()
    tests = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod tests\b", text, re.M)
    if tests:
        text = text[: tests.start()]
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"'(?:\\.|[^'\\\n])'", "' '", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def flatten(tree):
    """`a::{b::{C, d}, e as f}` -> ['a::b::C', 'a::b::d', 'a::e as f']."""
    tree = re.sub(r"\s*([{},]|::)\s*", r"\1", re.sub(r"\s+", " ", tree.strip()))
    open_at = tree.find("{")
    if open_at < 0:
        return [tree]
    depth, close_at = 0, len(tree)
    for i in range(open_at, len(tree)):
        depth += {"{": 1, "}": -1}.get(tree[i], 0)
        if depth == 0:
            close_at = i
            break
    head, inner = tree[:open_at], tree[open_at + 1 : close_at]
    parts, depth, current = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        current += ch
    parts.append(current)
    return [p for part in parts if part for p in flatten(head + part)]


def paths_in(text):
    """Every path (`a::b…`) outside re-exports, `use` groups flattened;
    the caller keeps those that name a module of the crate."""
    found = []
    for use in re.finditer(r"(?<!pub )(?<!\) )\buse\s+([^;]*);", text):
        found += flatten(use.group(1))
    rest = re.sub(r"\buse\s+[^;]*;", "", text)
    found += re.findall(r"(?<![:\w])" + IDENT + r"(?:::(?:" + IDENT + r"|\*))+", rest)
    return [p.partition(" as ")[0] for p in found]


def scopes(text):
    """The file's text outside its inline modules (`mod x { … }`), then
    each inline module's body with its name: `super::` inside one names
    the file's own module."""
    inline = []
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
        depth, end = 0, len(text)
        for i in range(m.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                end = i + 1
                break
        if not any(a <= m.start() < b for _, a, b in inline):
            inline.append((m.group(1), m.start(), end))
    outside, last = [], 0
    for _, a, b in inline:
        outside.append(text[last:a])
        last = b
    outside.append(text[last:])
    return [((), "".join(outside))] + [((name,), text[a:b]) for name, a, b in inline]


def words(text):
    """The identifiers a file's code mentions outside `use` lines."""
    return set(re.findall(IDENT, re.sub(r"\buse\s+[^;]*;", "", text)))


class Crate:
    def __init__(self, src):
        self.files = {}
        for path in glob.glob(os.path.join(src, "**", "*.rs"), recursive=True):
            if os.path.basename(path) != "tests.rs":
                self.files[module_of(src, path)] = code(path)
        self.reexports = {m: self._reexports(m, t) for m, t in self.files.items()}

    def _reexports(self, module, text):
        """name -> absolute path it is re-exported from; '*' -> glob sources."""
        out = {"*": []}
        for use in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]*);", text):
            for entry in flatten(use.group(1)):
                path, _, alias = entry.partition(" as ")
                segs = self.absolute(module, path.split("::"))
                if segs is None:
                    continue
                if segs[-1] == "*":
                    out["*"].append(tuple(segs[:-1]))
                else:
                    out[alias or segs[-1]] = tuple(segs)
        return out

    def absolute(self, module, segs):
        """A path's segments from the crate root, or None if external."""
        base, i = list(module), 0
        if segs[0] == "crate":
            base, i = [], 1
        elif segs[0] in ("self", "super"):
            while i < len(segs) and segs[i] in ("self", "super"):
                if segs[i] == "super":
                    base = base[:-1]
                i += 1
        elif tuple(module + (segs[0],)) not in self.files:
            return None
        return base + list(segs[i:])

    def target(self, segs, seen=()):
        """The file module that defines the item a root-relative path names."""
        module = ()
        for k, seg in enumerate(segs):
            if seg == "*":
                return module
            if module + (seg,) in self.files:
                module = module + (seg,)
                continue
            exports = self.reexports.get(module, {})
            if seg in exports and exports[seg] not in seen:
                return self.target(list(exports[seg]) + list(segs[k + 1 :]), seen + (exports[seg],))
            for source in exports.get("*", []):
                if source not in seen and source in self.files:
                    inner = self.target(list(source) + [seg], seen + (source,))
                    if inner != source:
                        return inner
            return module
        return module

    def edges(self):
        graph = {m: set() for m in self.files}
        for module, text in self.files.items():
            used = words(text)
            for inner, part in scopes(text):
                for path in paths_in(part):
                    segs = self.absolute(module + inner, path.split("::"))
                    if segs is None:
                        continue
                    to = self.target(segs)
                    graph[module].add(to)
                    if segs[-1] == "*":
                        # A glob reaches what the module re-exports too.
                        for name, origin in self.reexports.get(to, {}).items():
                            if name != "*" and name in used:
                                graph[module].add(self.target(list(origin)))
            # A name this module re-exports and its own code uses.
            for name, origin in self.reexports[module].items():
                if name != "*" and name in used:
                    graph[module].add(self.target(list(origin)))
            graph[module] = {to for to in graph[module] if to in self.files and to != module}
        return graph


def circles(graph):
    """Strongly connected groups of two or more nodes (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def folder_graph(graph, parent):
    """The edges between the children of folder `parent` (a module path),
    every file below a child collapsed to it; files outside `parent` and
    `parent`'s own mod.rs are left out."""
    depth = len(parent) + 1
    out = {}
    for m, targets in graph.items():
        if len(m) < depth or m[: len(parent)] != parent:
            continue
        node = m[:depth]
        out.setdefault(node, set()).update(
            t[:depth] for t in targets if len(t) >= depth and t[: len(parent)] == parent and t[:depth] != node
        )
    return out


def folder_circles(graph):
    """(folder, circle) for every folder whose children import in a circle."""
    parents = sorted({m[:k] for m in graph for k in range(len(m))})
    return [(p, group) for p in parents for group in circles(folder_graph(graph, p))]


def layer_tables(markdown):
    """{crate dir: {top-level module: layer}} from the tables in `markdown`
    whose header is `| layer | modules of `crates/NAME` |`."""
    tables, crate = {}, None
    for line in markdown.splitlines():
        head = re.match(r"^\| layer \| modules of `(crates/[\w-]+)` \|$", line)
        if head:
            crate = head.group(1)
            tables[crate] = {}
            continue
        row = re.match(r"^\| (\d+) \| (.*) \|$", line)
        if crate and row:
            for name in re.findall(r"`(\w+)`", row.group(2)):
                tables[crate][name] = int(row.group(1))
        elif crate and not line.startswith("|"):
            crate = None
    return tables


def layer_breaches(graph, layers):
    """Where the top-level modules break their table: a module the table
    leaves out, or a use of a module on the same layer or above."""
    out = []
    top = folder_graph(graph, ())
    for name in sorted(set(layers) - {m[0] for m in top}):
        out.append(f"{name} is in the table but is no module of the crate")
    for m in sorted(top):
        if m[0] not in layers:
            out.append(f"{m[0]} has no layer")
            continue
        for t in sorted(top[m]):
            if t[0] in layers and layers[t[0]] >= layers[m[0]]:
                out.append(f"{m[0]} (layer {layers[m[0]]}) uses {t[0]} (layer {layers[t[0]]})")
    return out


def layout_sections(markdown):
    """{crate dir: its lines of the layout's tree} (from its `crates/NAME`
    line to the next line that starts at the left margin)."""
    out, crate = {}, None
    for line in markdown.splitlines():
        head = re.match(r"^(crates/[\w-]+)\s", line)
        if head:
            crate = head.group(1)
            out[crate] = ""
        elif line[:1] not in (" ", "") or line.startswith("```"):
            crate = None
        elif crate:
            out[crate] += line + "\n"
    return out


def unnamed_folders(graph, section):
    """The crate's source folders whose name (`name/`) its layout section
    does not mention."""
    folders = sorted({m[:k] for m in graph for k in range(1, len(m))})
    return [f for f in folders if not re.search(r"(?<![\w/-])" + re.escape(f[-1]) + "/", section)]


def self_test():
    """The checks find a circle hidden behind a folder's re-export and a
    `use` group, none in a tree whose shared type has a file of its own, a
    circle among a folder's modules that no file circle shows, a layer
    table's breaches, and a folder not named in its crate's section."""
    import tempfile

    def tree(files):
        root = tempfile.mkdtemp()
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, "src", name)), exist_ok=True)
            open(os.path.join(root, "src", name), "w").write(text)
        return circles(Crate(os.path.join(root, "src")).edges())

    hidden = {
        "lib.rs": "pub mod p;",
        "p/mod.rs": "mod a;\nmod b;\npub use a::A;\npub use b::{B, Other as O};",
        "p/a.rs": "use super::{O, B as Bee}; // crate::p::b in a comment is no edge\npub struct A;",
        "p/b.rs": "pub struct B(crate::p::A);\npub struct Other;",
    }
    assert tree(hidden) == [[("p", "a"), ("p", "b")]], tree(hidden)
    hidden["p/a.rs"] = "pub struct A;"
    assert tree(hidden) == [], tree(hidden)
    # A folder's mod.rs defining what a child uses, and using the child's
    # item through its own re-export; a glob import; an inline module's
    # `super::` (its own file: no edge).
    hub = {
        "lib.rs": "mod p;\nmod q;",
        "p/mod.rs": "mod c;\npub use c::C;\npub struct K;\nfn f(_: C) {}",
        "p/c.rs": "pub struct C(super::K);",
        "q.rs": "use crate::p::*;\nmod inner {\n    use super::Q;\n}\npub struct Q;",
    }
    assert tree(hub) == [[("p",), ("p", "c")]], tree(hub)
    hub["p/mod.rs"] = "mod c;\npub use c::C;"
    hub["p/c.rs"] = "pub struct C;\nuse crate::q::Q;"
    hub["q.rs"] = "use crate::p::*;\npub struct Q(pub C);"
    assert tree(hub) == [[("p", "c"), ("q",)]], tree(hub)
    # Two folders inside one, their files importing each other's through a
    # third file: no circle among the files, one among the folder's children.
    nested = {
        "lib.rs": "mod p;",
        "p/mod.rs": "mod a;\nmod b;",
        "p/a/mod.rs": "mod x;\nmod y;",
        "p/a/x.rs": "use crate::p::b::z::Z;\npub struct X(Z);",
        "p/a/y.rs": "pub struct Y;",
        "p/b/mod.rs": "mod z;\nmod w;",
        "p/b/z.rs": "pub struct Z;",
        "p/b/w.rs": "use crate::p::a::y::Y;\npub struct W(Y);",
    }
    root = tempfile.mkdtemp()
    for name, text in nested.items():
        os.makedirs(os.path.dirname(os.path.join(root, "src", name)), exist_ok=True)
        open(os.path.join(root, "src", name), "w").write(text)
    graph = Crate(os.path.join(root, "src")).edges()
    assert circles(graph) == [], circles(graph)
    assert folder_circles(graph) == [(("p",), [("p", "a"), ("p", "b")])], folder_circles(graph)
    # A layer table: a use of the same layer or above, and a module left out.
    layers = layer_tables("| layer | modules of `crates/x` |\n|---|---|\n| 1 | `p` |\n| 1 | `q` |\n")
    assert layers == {"crates/x": {"p": 1, "q": 1}}, layers
    flat = {("p",): {("q",)}, ("q",): set(), ("r",): set()}
    assert layer_breaches(flat, layers["crates/x"]) == ["p (layer 1) uses q (layer 1)", "r has no layer"]
    assert layer_breaches({("q",): set()}, layers["crates/x"]) == ["p is in the table but is no module of the crate"]
    # A folder is named in its own crate's section of the tree, not another's.
    layout = "```\ncrates/x    the x\n  cpu/    twins\ncrates/y    the y\n  gpu/   kernels\n```\n"
    sections = layout_sections(layout)
    assert sections == {"crates/x": "  cpu/    twins\n", "crates/y": "  gpu/   kernels\n"}, sections
    two = {("cpu", "a"): set(), ("gpu", "b"): set()}
    assert unnamed_folders(two, sections["crates/x"]) == [("gpu",)], unnamed_folders(two, sections["crates/x"])


LAYOUT = "docs/design/layout.md"


def main(dirs):
    found = 0
    layout = open(LAYOUT, encoding="utf-8").read() if os.path.exists(LAYOUT) else ""
    layers = layer_tables(layout)
    sections = layout_sections(layout)
    for crate in dirs:
        src = os.path.join(crate, "src")
        if not os.path.isdir(src):
            continue
        graph = Crate(src).edges()
        for group in circles(graph):
            found += 1
            names = ", ".join("::".join(m) or "(root)" for m in group)
            print(f"{crate}: import circle among files: {names}")
            for m in group:
                inside = sorted("::".join(t) or "(root)" for t in graph[m] if t in group)
                print(f"    {'::'.join(m) or '(root)'} -> {', '.join(inside)}")
        # The same graph between the modules of each folder (the crate's
        # root too: its top-level modules, the crate's layers), every file
        # below one collapsed to it: a circle between files of two folders
        # does not show among the files when it passes through a third.
        for parent, group in folder_circles(graph):
            found += 1
            where = "top-level modules" if not parent else f"the modules of {'::'.join(parent)}"
            names = ", ".join(m[-1] for m in group)
            print(f"{crate}: import circle among {where}: {names}")
            layer = folder_graph(graph, parent)
            for m in group:
                inside = sorted(t[-1] for t in layer[m] if t in group)
                print(f"    {m[-1]} -> {', '.join(inside)}")
        # A library crate's layers as docs/design/layout.md states them
        # (the binary is the top of everything: no table).
        name = os.path.normpath(crate)
        library = os.path.exists(os.path.join(src, "lib.rs")) and len({m[0] for m in graph if m}) > 1
        if layout and library and name not in layers:
            found += 1
            print(f"{crate}: no table of its layers in {LAYOUT} (`| layer | modules of `{name}` |`)")
        for breach in layer_breaches(graph, layers[name]) if name in layers else []:
            found += 1
            print(f"{crate}: against its layers in {LAYOUT}: {breach}")
        # Every folder of the crate's sources is named in its section of
        # the layout's tree.
        for folder in unnamed_folders(graph, sections.get(name, "")) if layout else []:
            found += 1
            print(f"{crate}: the folder src/{'/'.join(folder)} is not named under {name} in {LAYOUT}")
        edges = sum(len(v) for v in graph.values())
        print(f"{crate}: {len(graph)} files, {edges} edges between them")
    if found:
        print(f"{found} import circle(s), layer breach(es) or unnamed folder(s)")
        return 1
    print("no import circle among files or a folder's modules, no layer breach, no unnamed folder, in any crate")
    return 0


if __name__ == "__main__":
    self_test()
    sys.exit(main(sys.argv[1:] or sorted(glob.glob("crates/*"))))
