#!/usr/bin/env python3
"""Tests of scripts/check_links.py on fixture pages made in a temporary directory: a tree whose
links all resolve (it must pass), one with each kind of broken link (each must be reported with
its file and line, and the check must fail), and the corner cases of slugs and code.

Run: python3 scripts/test_check_links.py (standard library only; no pytest needed).
"""

import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "check_links.py")

spec = importlib.util.spec_from_file_location("check_links", SCRIPT)
cl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cl)


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(text).lstrip("\n"))


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def good_tree(root):
    write(root, "README.md", """
        # Project

        See [the guide](docs/guide.md), [its setup](docs/guide.md#set-up-the-x-queue-type),
        [a folder](docs/img), ![a picture](docs/img/a.svg) and [the web](https://example.com/x.md).
        Mail [us](mailto:a@b.c).

        ```sh
        echo "[not a link](nowhere.md)"
        ```
        """)
    write(root, "docs/img/a.svg", "<svg/>\n")
    write(root, "docs/guide.md", """
        # Guide

        ## Set up the `x-queue-type`

        ## What's new? (v2)

        ## Repeated

        ## Repeated

        Setext heading
        --------------

        <a name="custom-anchor"></a>

        Back to [the top](#guide), [the second](#repeated-1), [the new](#whats-new-v2),
        [setext](#setext-heading), [custom](#custom-anchor), [readme](../README.md#project).
        A link whose text runs over
        two lines: [Replicated
        queues](sub/page.md#replicated-queues). Code is no link: `[x](missing.md)`.

        [ref]: sub/page.md
        """)
    write(root, "docs/sub/page.md", """
        # Page

        ## Replicated queues

        [Up](../guide.md "the guide"), [angle](<../guide.md>).
        """)
    write(root, "examples/ex/README.md", "[guide](../../docs/guide.md#guide)\n")


class GoodTree(unittest.TestCase):
    def test_every_link_resolves_and_the_check_passes(self):
        with tempfile.TemporaryDirectory() as root:
            good_tree(root)
            rc, out = run("--root", root)
            self.assertEqual(rc, 0, out)
            self.assertIn("4 page(s), every relative link resolves", out)


class BrokenTree(unittest.TestCase):
    def test_each_broken_link_is_reported_with_file_and_line(self):
        with tempfile.TemporaryDirectory() as root:
            good_tree(root)
            write(root, "docs/bad.md", """
                # Bad

                A [missing page](missing.md) and [a missing anchor](guide.md#no-such-heading).
                [Self](#not-here), [a path from the wrong folder](benchmarks/notes/x.md),
                ![gone](img/gone.png).

                [ref]: nowhere/else.md
                """)
            write(root, "examples/bad.md", "[up](../docs/guide.md#set-up-the-x-queue-type-2)\n")
            rc, out = run("--root", root)
            self.assertEqual(rc, 1, out)
            for line in [
                "docs/bad.md:3: missing.md (no such file)",
                "docs/bad.md:3: guide.md#no-such-heading (no heading '#no-such-heading' in docs/guide.md)",
                "docs/bad.md:4: #not-here (no heading '#not-here' in docs/bad.md)",
                "docs/bad.md:4: benchmarks/notes/x.md (no such file)",
                "docs/bad.md:5: img/gone.png (no such file)",
                "docs/bad.md:7: nowhere/else.md (no such file)",
                "examples/bad.md:1: ../docs/guide.md#set-up-the-x-queue-type-2 (no heading",
            ]:
                self.assertIn(line, out)
            self.assertIn("7 broken link(s) in 6 page(s)", out)

    def test_files_named_on_the_command_line_are_the_only_ones_checked(self):
        with tempfile.TemporaryDirectory() as root:
            good_tree(root)
            write(root, "docs/bad.md", "[x](missing.md)\n")
            rc, out = run("--root", root, os.path.join(root, "docs", "guide.md"))
            self.assertEqual(rc, 0, out)
            rc, out = run("--root", root, os.path.join(root, "docs", "bad.md"))
            self.assertEqual(rc, 1, out)
            self.assertIn("docs/bad.md:1: missing.md (no such file)", out)


class Parts(unittest.TestCase):
    def test_slugs_follow_github(self):
        self.assertEqual(cl.slug("Set up the `x-queue-type`"), "set-up-the-x-queue-type")
        self.assertEqual(cl.slug("What's new? (v2)"), "whats-new-v2")
        self.assertEqual(cl.slug("**Bold** and [a link](x.md)"), "bold-and-a-link")
        self.assertEqual(cl.slug("snake_case name"), "snake_case-name")
        self.assertEqual(cl.slug("Replicated queues (S7)"), "replicated-queues-s7")
        self.assertEqual(cl.slug("A - B"), "a---b")

    def test_duplicate_headings_get_numbers(self):
        a = cl.anchors("# A\n\n## A\n\n## A\n")
        self.assertEqual(a, {"a", "a-1", "a-2"})

    def test_headings_and_links_in_code_are_not_seen(self):
        text = "```\n# not a heading\n[x](y.md)\n```\n\n~~~\n[z](w.md)\n~~~\n`[q](r.md)` ``[s](t.md)``\n"
        self.assertEqual(cl.anchors(text), set())
        self.assertEqual(cl.links(text), [])

    def test_a_list_item_over_dashes_is_no_setext_heading(self):
        self.assertEqual(cl.anchors("- item\n---\n"), set())

    def test_link_lines_are_where_the_target_is(self):
        self.assertEqual(cl.links("intro\n\n[multi\nline](a.md) and [b](b.md#c)\n"),
                         [(4, "a.md"), (4, "b.md#c")])


if __name__ == "__main__":
    unittest.main(verbosity=1)
