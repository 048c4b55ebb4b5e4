#!/usr/bin/env python3
"""Checks the source tree's structure: no source file over a size, no import cycle in a crate.

1. Size: every `crates/*/src/**/*.rs` file must be at most `--max-lines` lines (default 800).
   Integration tests (`crates/*/tests`) are exempt: a test file may be long.
2. Cycles (`--crate crates/broker`, may be given several times): the modules of one crate and
   the references between them form a graph; every strongly connected component of more than
   one module is a cycle to cut. A layered crate has none: each module only uses the ones below.

The module graph, from the crate's file tree:
- `src/lib.rs` (or `src/main.rs` when there is no lib.rs) is `crate`; `src/a.rs` and
  `src/a/mod.rs` are `crate::a`; `src/a/b.rs` is `crate::a::b`. `src/bin/` holds other crates.
- An edge A -> B whenever A's code refers to a path into B: in `use` declarations (grouped
  forms `use crate::{x, y::z}` included) and inline paths (`crate::x::f()`), starting with
  `crate::`, `super::` (resolved from the module, inline `mod x { .. }` blocks counted), `self::`,
  or the name of one of A's child modules (Rust 2018 paths: `mod x;` then `x::f()`). A path
  counts as an edge to the deepest existing module on it (`crate::a::b::Item` -> `crate::a::b`).
- Not references: `mod x;` declarations (a declaration is not an import), comments and doc
  comments (an intra-doc link is not a dependency), string literals, `$crate` in macros, and
  anything under `#[cfg(test)]` (test modules, inline or in their own file, and test-only items).

Layers (`--layers`): the same graph with every module folded into its top-level module (the
crate root's child: `crate::a::b` counts as `crate::a`), so that a cycle is one between two of
the crate's parts (its layers), not one within a part split over several files (a parent and
its children naming each other's types: `queue/mod.rs` and `queue/handle.rs`). Every cycle
between parts is reported with the file-level references that form it. Without `--layers`,
every file-level cycle counts.

Output: with `--report`, the statistics (modules, edges, every cycle with the references that
form it, files over the limit) and exit status 0. Without it, the same problems and exit status 1
if there is any cycle or oversized file, 0 otherwise. Python 3 standard library only.

Usage: python3 scripts/check_structure.py [--max-lines N] [--crate crates/broker] [--layers] [--report]
"""

import argparse
import os
import re
import sys

DEFAULT_MAX_LINES = 800

# ------------------------------------------------------------------------------------------------
# Lexing: comments and literals blanked out, offsets and line numbers kept.


RAW_STRING = re.compile(r'(?:b|c)?r(#*)"')


def strip_code(text):
    """The source with comments and the contents of string and char literals replaced by
    spaces (newlines kept), so that every offset and line number still points at the original."""
    out = list(text)
    n = len(text)
    i = 0

    def blank(a, b):
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    def ident_char(c):
        return c.isalnum() or c == "_"

    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
            continue
        if c == "/" and nxt == "*":
            # Block comments nest in Rust.
            depth = 0
            j = i
            while j < n:
                if text.startswith("/*", j):
                    depth += 1
                    j += 2
                elif text.startswith("*/", j):
                    depth -= 1
                    j += 2
                    if depth == 0:
                        break
                else:
                    j += 1
            blank(i, j)
            i = j
            continue
        prev = text[i - 1] if i > 0 else ""
        # Raw strings: r"..", r#".."#, br"..", cr"..".
        m = RAW_STRING.match(text, i) if c in "bcr" and not ident_char(prev) else None
        if m:
            hashes = m.group(1)
            close = '"' + hashes
            j = text.find(close, m.end())
            j = n if j < 0 else j + len(close)
            blank(m.end(), j - len(close))
            i = j
            continue
        if c == '"' or (c in "bc" and nxt == '"' and not ident_char(prev)):
            start = i + 1 if c == '"' else i + 2
            j = start
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(start, j)
            i = j + 1
            continue
        if c == "'" or (c == "b" and nxt == "'" and not ident_char(prev)):
            q = i if c == "'" else i + 1
            # A char literal ('x', '\n', '\u{1F600}'); anything else is a lifetime or a label.
            if q + 1 < n and text[q + 1] == "\\":
                j = text.find("'", q + 3)
                if j > 0 and j - q < 12:
                    blank(q + 1, j)
                    i = j + 1
                    continue
            elif q + 2 < n and text[q + 2] == "'":
                blank(q + 1, q + 2)
                i = q + 3
                continue
            i = q + 1
            continue
        i += 1
    return "".join(out)


def blank_span(code, a, b):
    return code[:a] + "".join("\n" if ch == "\n" else " " for ch in code[a:b]) + code[b:]


def matching(code, open_at):
    """The offset just past the bracket that closes the one at `open_at`."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    stack = []
    i = open_at
    while i < len(code):
        ch = code[i]
        if ch in pairs:
            stack.append(pairs[ch])
        elif ch in ")}]":
            if stack and stack[-1] == ch:
                stack.pop()
            if not stack:
                return i + 1
        i += 1
    return len(code)


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
ATTR = re.compile(r"\s*#\s*\[")
MOD_DECL = re.compile(r"\b(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+([A-Za-z_]\w*)\s*;")


def drop_cfg_test(code):
    """Blanks every item under `#[cfg(test)]`. Returns the code and the names of the child
    modules declared test-only in their own file (`#[cfg(test)] mod tests;`)."""
    test_children = set()
    while True:
        m = CFG_TEST.search(code)
        if not m:
            return code, test_children
        i = m.end()
        # Further attributes on the same item.
        while True:
            a = ATTR.match(code, i)
            if not a:
                break
            i = matching(code, a.end() - 1)
        # The item: up to its `;` or through its `{ .. }`, whichever comes first at depth 0.
        j = i
        end = len(code)
        while j < len(code):
            ch = code[j]
            if ch in "([":
                j = matching(code, j)
                continue
            if ch == ";":
                end = j + 1
                break
            if ch == "{":
                end = matching(code, j)
                break
            j += 1
        decl = MOD_DECL.match(code, skip_ws(code, i, len(code)))
        if decl and decl.end() == end:
            test_children.add(decl.group(1))
        code = blank_span(code, m.start(), end)


# ------------------------------------------------------------------------------------------------
# Modules and the references between them.


def discover_modules(src):
    """Module path (a tuple, `("crate", "a", "b")`) -> file, from the file tree under `src`."""
    root_file = "lib.rs" if os.path.exists(os.path.join(src, "lib.rs")) else "main.rs"
    modules = {}
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        parts = [] if rel_dir == "." else rel_dir.split(os.sep)
        if parts[:1] == ["bin"]:
            dirnames[:] = []
            continue
        dirnames.sort()
        for f in sorted(filenames):
            if not f.endswith(".rs"):
                continue
            if not parts and f in ("lib.rs", "main.rs"):
                if f != root_file:
                    continue  # the other crate root of the package
                path = ("crate",)
            elif f == "mod.rs":
                path = ("crate", *parts)
            else:
                path = ("crate", *parts, f[:-3])
            modules[path] = os.path.join(dirpath, f)
    return modules


IDENT = r"[A-Za-z_]\w*"
USE = re.compile(r"(?<![\w$])use\s+")
INLINE_MOD = re.compile(r"(?<![\w$])mod\s+(" + IDENT + r")\s*\{")
# A path that starts a reference: not preceded by `::`, `.`, `$` or an identifier character.
PATH = re.compile(r"(?<![\w$.:])(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)")
SEG = re.compile(IDENT)
AS_ALIAS = re.compile(r"as\s+" + IDENT)


def skip_ws(code, i, end):
    while i < end and code[i].isspace():
        i += 1
    return i


def parse_use_tree(code, i, end, prefix, out):
    """Parses one use tree at `i` (up to `end`), appending (segments, offset of its last
    segment) for each leaf; returns the offset after the tree. In a group, `self` names the
    group's own path (`use a::{self, b}`)."""
    segs = list(prefix)
    last = i
    while True:
        i = skip_ws(code, i, end)
        if i >= end:
            break
        if code.startswith("::", i):
            if not segs:
                segs.append("::")  # `use ::extern_crate::..`
            i += 2
            continue
        if code[i] == "{":
            close = matching(code, i) - 1
            j = i + 1
            while j < close:
                j = skip_ws(code, j, close)
                if j < close and code[j] == ",":
                    j += 1
                    continue
                if j >= close:
                    break
                k = parse_use_tree(code, j, close, segs, out)
                j = k if k > j else j + 1
            return close + 1
        if code[i] == "*":
            out.append((segs, i))
            return i + 1
        m = SEG.match(code, i)
        if not m:
            break
        if m.group(0) == "as" and len(segs) > len(prefix):
            # `x as y`: the alias names nothing in the crate.
            a = AS_ALIAS.match(code, i)
            i = a.end() if a else m.end()
            continue
        if m.group(0) == "self" and prefix and len(segs) == len(prefix):
            out.append((segs, m.start()))
            a = AS_ALIAS.match(code, skip_ws(code, m.end(), end))
            return a.end() if a else m.end()
        segs.append(m.group(0))
        last = m.start()
        i = m.end()
    if len(segs) > len(prefix):
        out.append((segs, last))
    return i


def scope_at(offset, inline_mods):
    """The inline modules (names, outermost first) that contain `offset`."""
    return [name for (name, a, b) in inline_mods if a <= offset < b]


def resolve(segs, here, modules):
    """The deepest existing module a path refers to, from module `here` (a tuple that may run
    into inline modules), or None when it leaves the crate."""
    if not segs or segs[0] == "::":
        return None
    first = segs[0]
    rest = segs[1:]
    if first == "crate":
        base = ("crate",)
    elif first in ("self", "super"):
        base = here
        k = 0
        while k < len(segs) and segs[k] in ("self", "super"):
            if segs[k] == "super":
                base = base[:-1] if len(base) > 1 else base
            k += 1
        rest = segs[k:]
    elif here + (first,) in modules:
        base = here + (first,)
    else:
        return None
    # An inline module is no node of its own: its code belongs to the file's module.
    while base not in modules and len(base) > 1:
        base = base[:-1]
    for s in rest:
        if base + (s,) in modules:
            base = base + (s,)
        else:
            break
    return base


def line_of(code, offset):
    return code.count("\n", 0, offset) + 1


def references(path, file, modules, test_only):
    """(target module, line) for every reference from the file of module `path`."""
    with open(file, encoding="utf-8", errors="replace") as f:
        text = f.read()
    code = strip_code(text)
    if re.search(r"#!\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", code):
        test_only.add(path)
        return []
    code, test_children = drop_cfg_test(code)
    for name in test_children:
        test_only.add(path + (name,))
    inline_mods = [(m.group(1), m.end() - 1, matching(code, m.end() - 1)) for m in INLINE_MOD.finditer(code)]
    found = []
    # `use` declarations first, then blanked so that their paths are not read twice.
    for m in list(USE.finditer(code)):
        semi = code.find(";", m.end())
        if semi < 0:
            continue
        leaves = []
        parse_use_tree(code, m.end(), semi, [], leaves)
        here = path + tuple(scope_at(m.start(), inline_mods))
        for segs, at in leaves:
            target = resolve(segs, here, modules)
            if target is not None:
                found.append((target, line_of(code, at)))
        code = blank_span(code, m.start(), semi + 1)
    for m in PATH.finditer(code):
        segs = [m.group(1)] + re.findall(IDENT, m.group(2))
        first = segs[0]
        here = path + tuple(scope_at(m.start(), inline_mods))
        if first not in ("crate", "self", "super") and here + (first,) not in modules:
            continue
        target = resolve(segs, here, modules)
        if target is not None:
            found.append((target, line_of(code, m.start())))
    return found


def module_graph(crate_dir):
    """Modules, and edges (a, b) -> [(file, line), ..] between distinct modules."""
    src = os.path.join(crate_dir, "src")
    modules = discover_modules(src)
    test_only = set()
    raw = []
    # Parents first, so that a test-only child (`#[cfg(test)] mod tests;`) is known before it.
    for path in sorted(modules, key=len):
        if any(path[: k] in test_only for k in range(2, len(path) + 1)):
            continue
        for target, line in references(path, modules[path], modules, test_only):
            raw.append((path, target, modules[path], line))
    live = {p: f for p, f in modules.items() if not any(p[:k] in test_only for k in range(2, len(p) + 1))}
    edges = {}
    for a, b, file, line in raw:
        if a == b or a not in live or b not in live:
            continue
        edges.setdefault((a, b), []).append((file, line))
    return live, edges


def strongly_connected(nodes, edges):
    """Tarjan's algorithm, iterative: the components, each a sorted list of nodes."""
    succ = {n: [] for n in nodes}
    for a, b in edges:
        succ[a].append(b)
    for n in succ:
        succ[n].sort()
    index = {}
    low = {}
    on_stack = set()
    stack = []
    comps = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            recurse = False
            for k in range(i, len(succ[v])):
                w = succ[v][k]
                if w not in index:
                    work.append((v, k + 1))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return comps


# ------------------------------------------------------------------------------------------------
# Sizes.


def oversized(root, max_lines):
    """(path relative to root, lines) of every crates/*/src/**/*.rs file over max_lines."""
    found = []
    crates = os.path.join(root, "crates")
    if not os.path.isdir(crates):
        return found
    for crate in sorted(os.listdir(crates)):
        src = os.path.join(crates, crate, "src")
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames.sort()
            for f in sorted(filenames):
                if not f.endswith(".rs"):
                    continue
                p = os.path.join(dirpath, f)
                with open(p, encoding="utf-8", errors="replace") as fh:
                    n = len(fh.read().splitlines())
                if n > max_lines:
                    found.append((os.path.relpath(p, root), n))
    return found


# ------------------------------------------------------------------------------------------------


def name(path):
    return "::".join(path)


def fold(modules, edges):
    """The graph of the crate's parts: each module folded into its top-level module (the root
    stays itself); edges between distinct parts keep their references, one part's own go."""
    part = {m: m[:2] for m in modules}
    folded = {}
    for (a, b), locs in edges.items():
        pa, pb = part[a], part[b]
        if pa != pb:
            folded.setdefault((pa, pb), []).extend(locs)
    return sorted(set(part.values())), folded


def check_crate(root, crate, out, layers=False):
    """Prints the crate's graph and cycles; returns the number of cycles."""
    crate_dir = crate if os.path.isabs(crate) else os.path.join(root, crate)
    if not os.path.isdir(os.path.join(crate_dir, "src")):
        out.write(f"check_structure: {crate}: no src directory\n")
        return 1
    modules, edges = module_graph(crate_dir)
    if layers:
        out.write(f"{crate}: {len(modules)} modules folded into their top-level modules (--layers)\n")
        modules, edges = fold(modules, edges)
    refs = sum(len(v) for v in edges.values())
    cycles = [c for c in strongly_connected(list(modules), edges) if len(c) > 1]
    out.write(f"{crate}: {len(modules)} modules, {len(edges)} edges ({refs} references)\n")
    if not cycles:
        out.write(f"{crate}: no import cycle\n")
        return 0
    cycles.sort(key=len, reverse=True)
    out.write(f"{crate}: {len(cycles)} import cycle(s) (strongly connected components of more than one module)\n")
    for k, comp in enumerate(cycles, 1):
        members = set(comp)
        inner = sorted((a, b) for (a, b) in edges if a in members and b in members)
        out.write(f"\ncycle {k}: {len(comp)} modules, {len(inner)} edges\n")
        out.write("  modules: " + ", ".join(name(m) for m in comp) + "\n")
        out.write("  edges (source -> target: references, file:line):\n")
        for a, b in inner:
            locs = edges[(a, b)]
            where = ", ".join(f"{os.path.relpath(f, root)}:{line}" for f, line in sorted(set(locs)))
            out.write(f"    {name(a)} -> {name(b)} ({len(locs)}): {where}\n")
    return len(cycles)


def main(argv=None, out=sys.stdout):
    default_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description="Source file sizes and import cycles of the crates.")
    ap.add_argument("--max-lines", type=int, default=DEFAULT_MAX_LINES, help="the most lines a crates/*/src file may have (default 800)")
    ap.add_argument("--crate", action="append", default=[], help="a crate directory to check for import cycles, e.g. crates/broker (repeatable)")
    ap.add_argument("--layers", action="store_true", help="fold each module into its top-level module before looking for cycles")
    ap.add_argument("--report", action="store_true", help="print the statistics and exit 0 whatever they say")
    ap.add_argument("--root", default=default_root, help="the repository root (default: this script's parent directory)")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)

    cycles = 0
    for crate in args.crate:
        cycles += check_crate(root, crate, out, args.layers)
        out.write("\n")
    big = oversized(root, args.max_lines)
    if big:
        out.write(f"files over {args.max_lines} lines (crates/*/src): {len(big)}\n")
        for p, n in big:
            out.write(f"  {p}: {n}\n")
    else:
        out.write(f"no crates/*/src file over {args.max_lines} lines\n")
    if args.report:
        return 0
    if cycles or big:
        out.write(f"check_structure: FAILED ({cycles} cycle(s), {len(big)} oversized file(s))\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
