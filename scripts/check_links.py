#!/usr/bin/env python3
"""Checks that the relative links of the project's Markdown pages resolve.

    python3 scripts/check_links.py [--root DIR] [FILE.md ...]

Scans README.md, docs/**/*.md and examples/**/*.md under --root (default: this script's parent's
parent, the repository), or only the files named. For every relative link, `[text](path)`,
`[text](path#anchor)`, `[text](#anchor)`, an image `![alt](path)` or a reference definition
`[label]: path`, it checks that the path exists (a file or a folder, relative to the page), and,
for an anchor into a Markdown page (the page itself for `#anchor`), that the page has a heading
with that GitHub slug (or an HTML `id="..."` / `name="..."`). Links with a scheme (http:, https:,
mailto:, ...) and anchors into non-Markdown files are not checked. Fenced code blocks and inline
code spans are skipped, since what they hold is not a link.

GitHub's slug of a heading: its text as rendered (inline code, emphasis and links reduced to their
text), lower-cased, every character that is not a letter, a digit, `_`, `-` or a space dropped,
spaces turned into `-`; a repeated slug gets `-1`, `-2`, ... in page order.

Prints one line per broken link, `FILE:LINE: TARGET (why)`, and exits 1 if there is any, else 0.
Standard library only.
"""

import argparse
import glob
import os
import re
import sys
import urllib.parse

# A scheme (http:, mailto:, ...) or a protocol-relative URL: not a file of this repository.
EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")
# An inline link or image: [text](target "title"). The text may hold one level of brackets
# and run over lines; the target is <...> or has no spaces.
INLINE = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"
    r"\(\s*(<[^>\n]*>|[^\s()]+(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
# A reference definition at the start of a line: [label]: target
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>\n]*>|\S+)", re.M)
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HTML_ID = re.compile(r"<a\s[^>]*?(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)


def default_files(root):
    """README.md, docs/**/*.md and examples/**/*.md under ROOT, sorted."""
    files = [os.path.join(root, "README.md")] if os.path.isfile(os.path.join(root, "README.md")) else []
    for top in ("docs", "examples"):
        files += sorted(glob.glob(os.path.join(root, top, "**", "*.md"), recursive=True))
    return files


def blank_fences(text):
    """TEXT with the lines of fenced code blocks emptied, so line numbers stay where they were."""
    out, fence = [], None
    for ln in text.split("\n"):
        m = FENCE.match(ln)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not ln.strip()[len(m.group(1)):].strip():
                fence = None
            out.append("")
        else:
            out.append(ln)
    return "\n".join(out)


def blank_code(text):
    """TEXT with fenced code blocks emptied and inline code spans replaced by spaces, line
    breaks kept, so positions (and line numbers) stay where they were."""
    text = blank_fences(text)

    # Inline code: a run of N backticks up to the next run of exactly N (it may span lines).
    def spaces(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"(?<!`)(`+)(?!`)(?:.|\n)*?(?<!`)\1(?!`)", spaces, text)


def slug(heading):
    """GitHub's anchor for a heading's Markdown text (before de-duplication)."""
    s = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # links -> text
    s = re.sub(r"<[^>]+>", "", s)                                               # inline HTML
    s = s.replace("`", "")
    s = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", s)                              # emphasis marks
    s = s.strip().lower()
    s = "".join(c for c in s if c.isalnum() or c in "_- ")
    return s.replace(" ", "-")


def anchors(text):
    """Every anchor a Markdown page offers: its headings' slugs (ATX and setext, outside code
    blocks, de-duplicated as GitHub does) and its HTML ids and names."""
    lines = blank_fences(text).split("\n")
    seen, found = {}, set()
    for i, ln in enumerate(lines):
        m = ATX.match(ln)
        head = m.group(2) if m else None
        if head is None and i + 1 < len(lines) and ln.strip() and not ln.startswith(("    ", "\t")) \
                and re.match(r"^ {0,3}(=+|-+)\s*$", lines[i + 1]) \
                and not re.match(r"^ {0,3}([-*+]|\d+[.)])(\s|$)", ln) and not ln.lstrip().startswith(("|", ">")):
            head = ln.strip()
        if head is None:
            continue
        s = slug(head)
        n = seen.get(s, 0)
        seen[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")
    found.update(HTML_ID.findall(text))
    return found


def links(text):
    """(line, target) for every link of a Markdown page, outside code."""
    clean = blank_code(text)
    out = []
    for rx in (INLINE, REFDEF):
        for m in rx.finditer(clean):
            target = m.group(1)
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            out.append((clean.count("\n", 0, m.start(1)) + 1, target))
    return sorted(out)


def check_file(path, root, cache):
    """The broken links of one page: (line, target, why)."""
    text = read(path, cache)
    bad = []
    for line, target in links(text):
        if not target or EXTERNAL.match(target):
            continue
        path_part, _, frag = target.partition("#")
        path_part = urllib.parse.unquote(path_part.split("?", 1)[0])
        if path_part.startswith("/"):
            dest = os.path.join(root, path_part.lstrip("/"))
        elif path_part:
            dest = os.path.join(os.path.dirname(path), path_part)
        else:
            dest = path
        dest = os.path.normpath(dest)
        if not os.path.exists(dest):
            bad.append((line, target, "no such file"))
            continue
        if frag and dest.endswith(".md") and os.path.isfile(dest):
            if urllib.parse.unquote(frag) not in anchors(read(dest, cache)):
                bad.append((line, target, f"no heading '#{frag}' in {os.path.relpath(dest, root)}"))
    return bad


def read(path, cache):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            cache[path] = f.read()
    return cache[path]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("files", nargs="*", help="pages to check (default: README.md, docs/**, examples/**)")
    a = ap.parse_args(argv)
    root = os.path.abspath(a.root)
    files = [os.path.abspath(f) for f in a.files] or default_files(root)
    cache, broken = {}, 0
    for f in files:
        for line, target, why in check_file(f, root, cache):
            print(f"{os.path.relpath(f, root)}:{line}: {target} ({why})")
            broken += 1
    if broken:
        print(f"check_links.py: {broken} broken link(s) in {len(files)} page(s)", file=sys.stderr)
        return 1
    print(f"check_links.py: {len(files)} page(s), every relative link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
