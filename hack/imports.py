#!/usr/bin/env python3
"""Module import graph of the workspace's crates: which source file uses which, import circles,
and, for the EtcdadmCluster controller, imports that run back up a floor of its layering
(docs/architecture.md, "The EtcdadmCluster controller, floor by floor"). Test modules
(`#[cfg(test)]`) are left out: a test may look at the whole.

Circles are counted by file: a name used through a module's re-export (`use super::X` where the
parent's `mod.rs` says `pub use child::X`) makes the user depend on the re-exporting file as well
as on the one that defines it, so a child that imports through its parent's façade while the
parent uses the child is a circle.

    python3 hack/imports.py            # summary
    python3 hack/imports.py --edges    # every edge, with the names that make it
    python3 hack/imports.py --old-floors   # the floors of the layout before the concern modules
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRATES = {
    "shared": "shared/src",
    "bootstrap": "bootstrap/src",
    "etcdcluster": "etcdcluster/src",
    "sim": "test/sim/src",
    "sim-apiserver": "test/sim/apiserver/src",
    "sim-machines": "test/sim/machines/src",
}
# The EtcdadmCluster controller's floors, lowest first: a module may use its own floor and the
# ones below it. Module paths are prefixes (`controller::observation` covers its submodules).
OLD_FLOORS = [
    ["controller::plan::observed"],
    ["controller::plan::step"],
    ["controller::plan::certificates", "controller::plan::control_plane", "controller::plan::deletion",
     "controller::plan::gates", "controller::plan::growth", "controller::plan::learners",
     "controller::plan::placement", "controller::plan::preflight", "controller::plan::recovery",
     "controller::plan::remediation", "controller::plan::removal", "controller::plan::restore",
     "controller::plan::rollout", "controller::plan::versions"],
    ["controller::plan"],
    ["controller::observe", "controller::health", "controller::restore_source"],
    ["controller::apply"],
    ["controller::status"],
    ["controller::memo", "controller::watches", "controller"],
]
FLOORS = [
    ["controller::observation"],
    ["controller::decision"],
    ["controller::rules"],
    ["controller::plan::*"],
    ["controller::plan"],
    ["controller::status", "controller::apply"],
    ["controller::memo", "controller::watches", "controller"],
]

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = []
    for line in text.split("\n"):
        # Drop `//` comments outside strings (good enough: strings with `//` rarely hold paths).
        in_str = False
        cut = len(line)
        i = 0
        while i < len(line):
            c = line[i]
            if c == '"' and (i == 0 or line[i - 1] != "\\"):
                in_str = not in_str
            elif not in_str and line.startswith("//", i):
                cut = i
                break
            i += 1
        out.append(line[:cut])
    return "\n".join(out)


def strip_strings(text):
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def strip_test_modules(text):
    """Remove `#[cfg(test)] mod x { ... }` blocks and `#[cfg(test)] mod x;` declarations."""
    out = []
    i = 0
    pattern = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*([{;])")
    while True:
        m = pattern.search(text, i)
        if not m:
            out.append(text[i:])
            break
        out.append(text[i : m.start()])
        if m.group(1) == ";":
            i = m.end()
            continue
        depth = 1
        j = m.end()
        while j < len(text) and depth:
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
            j += 1
        i = j
    return "".join(out)


def test_only_children(text):
    return set(re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text))


def modules_of(crate_dir):
    """module path (tuple) -> file, for every file module reachable without cfg(test)."""
    mods = {}
    base = os.path.join(ROOT, crate_dir)
    roots = [f for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(base, f))]

    def walk(path, file):
        mods[path] = file
        text = strip_comments(open(file).read())
        skip = test_only_children(text)
        directory = os.path.dirname(file) if os.path.basename(file) in ("mod.rs", "lib.rs", "main.rs") else file[:-3]
        for name in re.findall(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text):
            if name in skip:
                continue
            for candidate in (os.path.join(directory, name + ".rs"), os.path.join(directory, name, "mod.rs")):
                if os.path.exists(candidate):
                    walk(path + (name,), candidate)
                    break

    for r in roots[:1]:
        walk((), os.path.join(base, r))
    return mods


def parse_use_tree(tree):
    """`a::b::{c, d::e}` -> [['a','b','c'], ['a','b','d','e']]"""
    tree = tree.strip()
    results = []
    depth = 0
    for i, c in enumerate(tree):
        if c == "{":
            prefix = tree[:i].strip().rstrip(":").strip()
            inner = tree[i + 1 : tree.rindex("}")]
            parts, buf, d = [], "", 0
            for ch in inner:
                if ch == "," and d == 0:
                    parts.append(buf)
                    buf = ""
                    continue
                if ch == "{":
                    d += 1
                if ch == "}":
                    d -= 1
                buf += ch
            parts.append(buf)
            base = [p for p in prefix.split("::") if p]
            for part in parts:
                if part.strip():
                    for sub in parse_use_tree(part):
                        results.append(base + sub)
            return results
    path = tree.split(" as ")[0].strip()
    return [[p for p in path.split("::") if p]]


def resolve(current, segments, mods, crate_extern):
    """The module path a `use` path starts from, and the remaining segments."""
    if not segments:
        return None
    head = segments[0]
    if head == "crate":
        return (), segments[1:]
    if head == "self":
        return current, segments[1:]
    if head == "super":
        path = current
        rest = segments
        while rest and rest[0] == "super":
            path = path[:-1]
            rest = rest[1:]
        return path, rest
    if head in crate_extern:
        return ("@" + crate_extern[head],), segments[1:]
    # A child module of the current one (`use child::X` in a mod.rs).
    if current + (head,) in mods:
        return current, segments
    return None


def main():
    show_edges = "--edges" in sys.argv
    extern = {"etcdadm_shared": "shared"}
    graph = {}
    all_mods = {}
    reexports = {}
    crate_texts = {}
    for crate, directory in CRATES.items():
        mods = modules_of(directory)
        all_mods[crate] = mods
        for path, file in mods.items():
            text = strip_strings(strip_test_modules(strip_comments(open(file).read())))
            crate_texts[(crate, path)] = text
            # pub use re-exports: name -> full path segments (relative resolution later)
            for m in re.finditer(r"pub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
                for seg in parse_use_tree(m.group(1)):
                    if seg:
                        alias = m.group(1).split(" as ")[-1].strip() if " as " in m.group(1) and "{" not in m.group(1) else seg[-1]
                        reexports.setdefault((crate, path), {})[alias] = seg

    def targets(crate, current, segments, depth=0):
        """The modules a `use` path depends on: the module it names (the file the name is looked
        up in) and, when that module re-exports the name, the module it comes from, and so on
        down the chain. A file depends on every file its names pass through, so a loop through a
        re-export is a loop."""
        mods = all_mods[crate]
        r = resolve(current, segments, mods, extern if crate != "shared" else {})
        if r is None:
            return []
        start, rest = r
        if start and start[0].startswith("@"):
            crate = start[0][1:]
            mods = all_mods[crate]
            start = ()
        path = start
        i = 0
        while i < len(rest) and path + (rest[i],) in mods:
            path = path + (rest[i],)
            i += 1
        found = [(crate, path)]
        # Follow a re-export of the next name, if the module re-exports it.
        if i < len(rest) and depth < 5:
            mapping = reexports.get((crate, path), {})
            if rest[i] in mapping:
                found += targets(crate, path, mapping[rest[i]], depth + 1)
        return found

    for (crate, path), text in crate_texts.items():
        edges = defaultdict(set)
        uses = []
        for m in re.finditer(r"(?<![A-Za-z0-9_])use\s+([^;]+);", text):
            uses.extend(parse_use_tree(m.group(1)))
        body = re.sub(r"(?<![A-Za-z0-9_])use\s+[^;]+;", "", text)
        for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:crate|super|self|etcdadm_shared)(?:::" + IDENT + r")+)", body):
            uses.append(m.group(1).split("::"))
        for segments in uses:
            for t in targets(crate, path, segments):
                if t != (crate, path):
                    edges[t].add("::".join(segments[-2:]))
        graph[(crate, path)] = edges

    def name(node):
        crate, path = node
        return crate + ":" + ("::".join(path) or "(root)")

    # Circles: strongly connected components of more than one module.
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in graph:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    for v in list(graph):
        if v not in index:
            strong(v)

    floors = OLD_FLOORS if "--old-floors" in sys.argv else FLOORS

    def floor(path):
        text = "::".join(path)
        best = None
        for level, prefixes in enumerate(floors):
            for p in prefixes:
                if p.endswith("::*"):
                    matches = text.startswith(p[:-1])
                else:
                    matches = text == p or text.startswith(p + "::")
                if matches and (best is None or len(p) > best[1]):
                    best = (level, len(p))
        return None if best is None else best[0]

    upward = []
    for (crate, path), edges in graph.items():
        if crate != "etcdcluster":
            continue
        f = floor(path)
        for (tcrate, tpath), names in edges.items():
            if tcrate != "etcdcluster":
                continue
            g = floor(tpath)
            if f is not None and g is not None and g > f:
                upward.append((name((crate, path)), name((tcrate, tpath)), sorted(names)))

    print(f"modules: {sum(len(m) for m in all_mods.values())}, edges: {sum(len(e) for e in graph.values())}")
    print(f"import circles: {len(sccs)}")
    for comp in sccs:
        print(f"  {len(comp)} modules: " + ", ".join(sorted(name(n) for n in comp)))
    print(f"imports running back up a floor in etcdcluster/src/controller: {len(upward)}")
    for a, b, names in upward:
        print(f"  {a} -> {b} ({', '.join(names)})")
    if show_edges:
        for node, edges in sorted(graph.items()):
            for t, names in sorted(edges.items()):
                print(f"{name(node)} -> {name(t)}: {', '.join(sorted(names))}")


if __name__ == "__main__":
    main()
