"""Tests import like users do: through pytest's `pythonpath` (pyproject.toml: tests/support, tests/npu, virtual,
virtual/engine, virtual/cpu_bridges) or the installed package; a script a test starts as a child process gets what
it imports on the PYTHONPATH its parent gives it (where pyproject.toml is absent, as in the image, the script that
runs pytest sets PYTHONPATH: scripts/accept-npu.sh). Nothing under tests/ edits sys.path."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
MUTATORS = {"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort"}


def sys_path_edits(source: str, filename: str = "<string>") -> list[str]:
    """Where a Python source edits sys.path: a mutating call (sys.path.insert/append/extend/...), an assignment,
    augmented assignment or del of sys.path or of sys.path[...]. Aliases count (`import sys as s`, `from sys import
    path`); reading sys.path does not."""
    tree = ast.parse(source, filename)
    sys_names, path_names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            sys_names |= {a.asname or a.name for a in node.names if a.name == "sys"}
        elif isinstance(node, ast.ImportFrom) and node.module == "sys":
            path_names |= {a.asname or a.name for a in node.names if a.name == "path"}

    def is_sys_path(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id in sys_names
        return isinstance(node, ast.Name) and node.id in path_names

    def edited(target: ast.AST) -> bool:
        if isinstance(target, (ast.Tuple, ast.List)):
            return any(edited(t) for t in target.elts)
        if isinstance(target, ast.Starred):
            return edited(target.value)
        return is_sys_path(target) or (isinstance(target, ast.Subscript) and is_sys_path(target.value))

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and is_sys_path(node.func.value):
            hits.append((node.lineno, ast.unparse(node)))
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(edited(t) for t in targets):
            hits.append((node.lineno, ast.unparse(node).splitlines()[0]))
    return [f"{filename}:{line}: {text}" for line, text in sorted(hits)]


def test_nothing_under_tests_edits_sys_path():
    hits = []
    for path in sorted(TESTS.rglob("*.py")):
        name = str(path.relative_to(REPO))
        if "__pycache__" not in path.parts:
            hits += sys_path_edits(path.read_text(), name)
    assert hits == [], "import through pytest's pythonpath (pyproject.toml) or a child's PYTHONPATH instead:\n" + \
        "\n".join(hits)


def test_the_walker_sees_every_kind_of_edit_and_no_read():
    edits = '''
import sys
import sys as system
from sys import path as sp
sys.path.insert(0, "a")
sys.path.append("b")
system.path.extend(["c"])
sp.insert(0, "d")
sys.path = ["e"]
sys.path[:] = saved
sys.path[0] = "f"
sys.path += ["g"]
del sys.path[0]
first, sys.path = 1, []
'''
    assert [h.split(":")[1] for h in sys_path_edits(edits)] == [str(n) for n in range(5, 15)]
    reads = '''
import sys
saved = list(sys.path)
site = [p for p in sys.path if p.endswith("site-packages")]
here = sys.path[0]
env = {"PYTHONPATH": ":".join(sys.path)}
path = []
path.insert(0, "not sys.path")
other.path.insert(0, "not sys either")
'''
    assert sys_path_edits(reads) == []
