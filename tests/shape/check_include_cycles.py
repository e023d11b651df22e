#!/usr/bin/env python3
"""Fail when the quoted #include lines of the product sources form a cycle between modules.

A module is a file pair, foo.c and foo.h (STYLE.md: one file pair per daemon subsystem), with its
private header foo_int.h.  Module A depends on module B when a file of A includes B's header.  Two
modules that depend on each other (session.c includes ops.h while ops.c includes session.h) are
one subsystem split in two, or share types that belong in a header of their own; either way
neither can be read, tested or replaced alone.  A header that includes itself back through others
is the same fault and is reported the same way.

This reads every .c/.h/.cu under the product directories, resolves each `#include "x.h"` the way
the compiler does for these targets (the including file's own directory first, then the include
directories the CMake targets export), and reports each cycle with the includes that close it.
Lines inside comments are not read; a conditional include counts.

Usage: check_include_cycles.py [SOURCE_ROOT]   (exit 0: no cycle, 1: cycles, 2: bad usage)
"""
import os
import re
import sys

# Directories scanned, and the include path the CMake targets give their sources
# (kvtd_core, kvt_engine, kvt_dev, kvt_proto, kvt_common, the client library).
SCAN = ["daemon", "engine", "dev", "client", "client/include", "proto", "common"]
INCLUDE_PATH = ["daemon", "engine", "dev", "client", "client/include", "proto", "common"]
SUFFIXES = (".c", ".h", ".cu", ".cuh")
# The daemon's root header: struct kvtd owns one instance of each subsystem (STYLE.md rule 10), so
# it includes their headers, and the .c files that take a struct kvtd include it.  Those includes
# are the ownership tree, not a dependency of one subsystem on another, and are not followed; a
# header including the root would tie its module to every subsystem and is refused outright.
ROOTS = ["daemon/kvtd.h"]
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def strip_comments(text):
    """Blank out /* */ and // comments, keeping line breaks so line numbers stay true."""
    out = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", out)


def resolve(root, src, name):
    for d in [os.path.dirname(src)] + [os.path.join(root, p) for p in INCLUDE_PATH]:
        cand = os.path.normpath(os.path.join(d, name))
        if os.path.isfile(cand):
            return cand
    return None


def module_of(path):
    """foo.c, foo.h and foo_int.h are module foo of their directory."""
    stem, _ = os.path.splitext(path)
    if stem.endswith("_int"):
        stem = stem[: -len("_int")]
    return stem


def build_graph(root):
    """Module graph: {module: [module it depends on]}, and {(a, b): [(file, included)]}."""
    files = []
    for d in SCAN:
        full = os.path.join(root, d)
        if not os.path.isdir(full):
            continue
        for f in sorted(os.listdir(full)):
            if f.endswith(SUFFIXES):
                files.append(os.path.normpath(os.path.join(full, f)))
    graph, witness, root_in_header = {}, {}, []
    for src in files:
        a = module_of(src)
        graph.setdefault(a, [])
        with open(src, encoding="utf-8", errors="replace") as fh:
            text = strip_comments(fh.read())
        for line in text.splitlines():
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            target = resolve(root, src, m.group(1))
            # Generated headers (kvt_version.h) and system headers quoted by mistake do not
            # resolve in the tree; they cannot close a cycle among tree files.
            if not target:
                continue
            b = module_of(target)
            if b == a:
                continue
            if os.path.relpath(target, root) in ROOTS:
                if src.endswith((".h", ".cuh")):
                    root_in_header.append((src, target))
                continue
            if b not in graph[a]:
                graph[a].append(b)
            witness.setdefault((a, b), []).append((src, target))
    return graph, witness, root_in_header


def find_cycles(graph):
    """Strongly connected components of more than one file, or one file including itself."""
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    counter = [0]

    def strongconnect(v):
        # Iterative Tarjan: the include graph is small, but recursion limits are not ours to set.
        work = [(v, iter(graph.get(v, [])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph.get(w, []))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1 or node in graph.get(node, []):
                    sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sccs


def one_cycle(graph, comp):
    """A shortest path around the component from its first file back to itself, for the message."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in graph.get(v, []):
                if w == start:
                    path = [w, v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path))
                if w in members and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start, start]


def main(argv):
    if len(argv) > 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1] if len(argv) == 2 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    if not os.path.isdir(os.path.join(root, "daemon")):
        print(f"check_include_cycles: {root} has no daemon/ directory; pass the source root",
              file=sys.stderr)
        return 2
    graph, witness, root_in_header = build_graph(root)
    cycles = find_cycles(graph)
    rel = lambda p: os.path.relpath(p, root)
    for comp in cycles:
        loop = one_cycle(graph, comp)
        print(f"include cycle among modules {', '.join(rel(p) for p in comp)}: "
              + " -> ".join(rel(p) for p in loop))
        for a, b in zip(loop, loop[1:]):
            for src, target in witness[(a, b)]:
                print(f"  {rel(src)} includes {rel(target)}")
    for src, target in root_in_header:
        print(f"{rel(src)} includes the root header {rel(target)}: a subsystem header names the "
              "types it needs, not the whole daemon")
    if cycles or root_in_header:
        print(f"{len(cycles)} include cycle(s): move what both sides need into the header it "
              "belongs to (or a small shared header), then drop the include that closes the loop",
              file=sys.stderr)
        return 1
    print(f"no include cycle among {len(graph)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
