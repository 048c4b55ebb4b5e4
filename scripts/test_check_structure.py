#!/usr/bin/env python3
"""Tests of scripts/check_structure.py on tiny fixture crates made in a temporary directory:
one with an import cycle and an oversized file (both must be found, and the check must fail),
one layered crate (it must pass), and the parser's corner cases (grouped uses, `super::`,
deepest module, comments, strings, test-only code, `mod x;` declarations).

Run: python3 scripts/test_check_structure.py (standard library only; no pytest needed).
"""

import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "check_structure.py")

spec = importlib.util.spec_from_file_location("check_structure", SCRIPT)
cs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cs)


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(text).lstrip("\n"))


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def cyclic_fixture(root):
    write(root, "crates/fix/src/lib.rs", """
        //! A doc comment that names crate::b, which is no reference.
        mod a;
        mod b;
        pub mod big;
        #[cfg(test)]
        #[allow(clippy::unwrap_used)]
        mod tests;

        pub const NAME: &str = "crate::a::f is only text";
        """)
    write(root, "crates/fix/src/a.rs", """
        use crate::b::helper;

        pub fn f() -> u32 {
            helper()
        }
        """)
    write(root, "crates/fix/src/b.rs", """
        pub fn helper() -> u32 {
            1
        }

        pub fn g() -> u32 {
            crate::a::f() + 1
        }
        """)
    write(root, "crates/fix/src/big.rs", "pub fn big() {}\n" + "// filler\n" * 820)
    # Test-only code may refer to anything: it makes no edge.
    write(root, "crates/fix/src/tests.rs", """
        use crate::big::big;
        use crate::a::f;
        """)
    # An integration test is exempt from the size limit.
    write(root, "crates/fix/tests/long.rs", "#[test]\nfn t() {}\n" + "// filler\n" * 900)


def layered_fixture(root):
    write(root, "crates/ok/src/lib.rs", """
        pub mod net;
        pub mod util;

        /// Declared inline: its paths resolve from `crate::proto`.
        pub mod proto {
            use super::util::checksum;

            pub struct Frame;

            pub fn parse() -> u32 {
                checksum()
            }
        }
        """)
    write(root, "crates/ok/src/util.rs", """
        pub fn checksum() -> u32 {
            let s = "crate::net::conn::open()";
            let c = '"';
            let _ = (s, c);
            7
        }

        #[cfg(test)]
        mod tests {
            // Would close a cycle util -> net::conn -> util if test code counted.
            use crate::net::conn::open;

            #[test]
            fn t() {
                open();
            }
        }
        """)
    write(root, "crates/ok/src/net/mod.rs", """
        pub mod conn;

        pub use conn::open;
        """)
    write(root, "crates/ok/src/net/conn.rs", """
        use crate::{
            proto::{self, Frame},
            util::checksum as sum,
        };

        pub fn open<'a>(x: &'a str) -> &'a str {
            let _f: Option<Frame> = None;
            let _ = (proto::parse(), sum());
            x
        }
        """)


class CheckerOnFixtures(unittest.TestCase):
    def test_a_cycle_and_an_oversized_file_are_found_and_fail_the_check(self):
        with tempfile.TemporaryDirectory() as root:
            cyclic_fixture(root)
            code, out = run("--root", root, "--crate", "crates/fix")
            self.assertEqual(code, 1, out)
            self.assertIn("crates/fix: 1 import cycle(s)", out)
            self.assertIn("modules: crate::a, crate::b", out)
            self.assertIn("crate::a -> crate::b (1): crates/fix/src/a.rs:1", out)
            self.assertIn("crate::b -> crate::a (1): crates/fix/src/b.rs:6", out)
            self.assertIn("crates/fix/src/big.rs: 821", out)
            self.assertNotIn("long.rs", out, "tests directories are exempt")
            self.assertNotIn("tests.rs", out, "test-only code makes no edge")
            self.assertIn("FAILED (1 cycle(s), 1 oversized file(s))", out)

    def test_report_prints_the_same_and_exits_0(self):
        with tempfile.TemporaryDirectory() as root:
            cyclic_fixture(root)
            code, out = run("--report", "--root", root, "--crate", "crates/fix")
            self.assertEqual(code, 0, out)
            self.assertIn("crates/fix: 4 modules, 2 edges (2 references)", out)
            self.assertIn("cycle 1: 2 modules, 2 edges", out)
            self.assertIn("files over 800 lines (crates/*/src): 1", out)

    def test_max_lines_is_the_limit(self):
        with tempfile.TemporaryDirectory() as root:
            cyclic_fixture(root)
            code, out = run("--root", root, "--max-lines", "900")
            self.assertEqual(code, 0, out)
            self.assertIn("no crates/*/src file over 900 lines", out)
            code, out = run("--root", root, "--max-lines", "5")
            self.assertEqual(code, 1, out)
            self.assertIn("crates/fix/src/b.rs: 7", out)
            self.assertNotIn("a.rs", out, "5 lines is not over a limit of 5")

    def test_a_layered_crate_passes(self):
        with tempfile.TemporaryDirectory() as root:
            layered_fixture(root)
            code, out = run("--root", root, "--crate", "crates/ok")
            self.assertEqual(code, 0, out)
            self.assertIn("crates/ok: no import cycle", out)
            modules, edges = cs.module_graph(os.path.join(root, "crates/ok"))
            self.assertEqual(
                sorted(cs.name(m) for m in modules),
                ["crate", "crate::net", "crate::net::conn", "crate::util"],
            )
            self.assertEqual(
                sorted((cs.name(a), cs.name(b)) for a, b in edges),
                [
                    ("crate", "crate::util"),  # the inline `proto` is part of the root
                    ("crate::net", "crate::net::conn"),  # `pub use conn::open`, a child path
                    ("crate::net::conn", "crate"),  # `proto::{self, Frame}`: proto is the root's
                    ("crate::net::conn", "crate::util"),
                ],
            )


    def test_layers_fold_a_part_split_over_files_but_not_a_cycle_between_parts(self):
        with tempfile.TemporaryDirectory() as root:
            # `q` and its child name each other (one part over two files); `q` uses `low`.
            write(root, "crates/parts/src/lib.rs", """
                pub mod low;
                pub mod q;
                """)
            write(root, "crates/parts/src/low.rs", """
                pub fn f() {}
                """)
            write(root, "crates/parts/src/q/mod.rs", """
                pub mod handle;
                pub use handle::Handle;
                pub struct Q(pub Option<Box<Handle>>);
                pub fn g() { crate::low::f() }
                """)
            write(root, "crates/parts/src/q/handle.rs", """
                use super::Q;
                pub struct Handle(pub Q);
                """)
            code, out = run("--root", root, "--crate", "crates/parts")
            self.assertEqual(code, 1, out)
            self.assertIn("modules: crate::q, crate::q::handle", out)
            code, out = run("--root", root, "--crate", "crates/parts", "--layers")
            self.assertEqual(code, 0, out)
            self.assertIn("crates/parts: 3 modules, 1 edges (1 references)", out)
            self.assertIn("crates/parts: no import cycle", out)
            # The part below naming the one above closes a cycle between parts.
            write(root, "crates/parts/src/low.rs", """
                pub fn f() {}
                pub fn h(_: crate::q::handle::Handle) {}
                """)
            code, out = run("--root", root, "--crate", "crates/parts", "--layers")
            self.assertEqual(code, 1, out)
            self.assertIn("modules: crate::low, crate::q", out)
            self.assertIn("crate::low -> crate::q (1): crates/parts/src/low.rs:2", out)
            self.assertIn("crate::q -> crate::low (1): crates/parts/src/q/mod.rs:4", out)


class Parser(unittest.TestCase):
    def test_comments_and_literals_are_blanked_with_lines_kept(self):
        src = 'let a = "x // y"; /* crate::a /* nested */ still */ let b = \'"\';\n// crate::b\nlet c: &\'static str = r#"crate::c"#;\n'
        code = cs.strip_code(src)
        self.assertEqual(len(code), len(src))
        self.assertEqual(code.count("\n"), src.count("\n"))
        self.assertNotIn("crate::", code)
        self.assertIn("let b =", code)
        self.assertIn("&'static str", code, "a lifetime is no char literal")

    def test_use_trees(self):
        code = "use crate::{a, b::{c, d as e}, self};"
        leaves = []
        cs.parse_use_tree(code, 4, code.index(";"), [], leaves)
        self.assertEqual(
            [segs for segs, _ in leaves],
            [["crate", "a"], ["crate", "b", "c"], ["crate", "b", "d"], ["crate"]],
        )
        leaves = []
        code = "use super::super::x::*;"
        cs.parse_use_tree(code, 4, code.index(";"), [], leaves)
        self.assertEqual([segs for segs, _ in leaves], [["super", "super", "x"]])

    def test_paths_resolve_to_the_deepest_existing_module(self):
        mods = {("crate",), ("crate", "a"), ("crate", "a", "b"), ("crate", "c")}
        here = ("crate", "a", "b")
        self.assertEqual(cs.resolve(["crate", "a", "b", "Item"], here, mods), ("crate", "a", "b"))
        self.assertEqual(cs.resolve(["crate", "a", "Missing", "b"], here, mods), ("crate", "a"))
        self.assertEqual(cs.resolve(["crate", "Config"], here, mods), ("crate",))
        self.assertEqual(cs.resolve(["super", "Thing"], here, mods), ("crate", "a"))
        self.assertEqual(cs.resolve(["super", "super", "c", "f"], here, mods), ("crate", "c"))
        self.assertEqual(cs.resolve(["self", "x"], here, mods), ("crate", "a", "b"))
        self.assertEqual(cs.resolve(["b", "f"], ("crate", "a"), mods), ("crate", "a", "b"))
        self.assertIsNone(cs.resolve(["std", "io"], here, mods), "outside the crate")
        self.assertIsNone(cs.resolve(["::", "serde"], here, mods))

    def test_cfg_test_items_and_test_modules_in_files_are_dropped(self):
        code = cs.strip_code(
            "#[cfg(test)]\n#[allow(x)]\nmod tests;\n"
            "#[cfg(test)]\nuse crate::x;\n"
            "#[cfg(test)]\nfn helper() -> Vec<u8> { crate::y::f() }\n"
            "use crate::z;\n"
        )
        kept, test_children = cs.drop_cfg_test(code)
        self.assertEqual(test_children, {"tests"})
        self.assertNotIn("crate::x", kept)
        self.assertNotIn("crate::y", kept)
        self.assertIn("use crate::z;", kept)
        self.assertEqual(kept.count("\n"), code.count("\n"))

    def test_strongly_connected_components(self):
        nodes = ["a", "b", "c", "d", "e"]
        edges = {("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): [], ("d", "e"): [], ("e", "d"): []}
        comps = sorted(cs.strongly_connected(nodes, edges))
        self.assertEqual(comps, [["a", "b", "c"], ["d", "e"]])
        self.assertEqual(sorted(cs.strongly_connected(["x", "y"], {("x", "y"): []})), [["x"], ["y"]])

    def test_main_can_write_to_a_stream(self):
        with tempfile.TemporaryDirectory() as root:
            layered_fixture(root)
            out = io.StringIO()
            self.assertEqual(cs.main(["--root", root, "--crate", "crates/ok", "--report"], out), 0)
            self.assertIn("crates/ok: 4 modules, 4 edges", out.getvalue())


if __name__ == "__main__":
    unittest.main(verbosity=2)
