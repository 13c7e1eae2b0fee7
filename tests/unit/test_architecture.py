"""The package's shape (docs/architecture.md): layers that import in one direction, commands at the edge,
nothing under tests/ reached from the product, one of each shared helper."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "src" / "rollout8"

# Layer of each top-level part of the package; a module may import only from its own layer or lower ones.
LAYERS = {
    "errors": 0, "findings": 0, "paths": 0, "fileutil": 0, "overlap": 0, "lock": 0, "pylock": 0, "peak_memory": 0,
    "yamlio": 0, "models": 0, "pyindex": 0, "wheelcheck": 0,
    "quant": 1, "results": 1,
    "runspec": 2,
    "node": 3,
    "commands": 4,
    "cli": 5, "activate": 5, "__main__": 5,
    "__init__": 0,  # the root package: only __version__
}


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_imports(root: Path) -> dict[str, set[str]]:
    """module -> the package modules it imports (at any depth: lazy imports inside functions count)."""
    graph: dict[str, set[str]] = {}
    top = root.name
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        is_pkg = path.name == "__init__.py"
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.split(".")[0] == top)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[: len(base) - node.level + 1]
                    target = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != top:
                    continue
                deps.add(target)
                deps.update(f"{target}.{a.name}" for a in node.names)  # `from . import x` names a module
        graph[name] = deps
    known = set(graph)
    return {m: {d for d in deps if d in known and d != m} for m, deps in graph.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer_of(module: str) -> int:
    parts = module.split(".")
    part = parts[1] if len(parts) > 1 else "__init__"
    if part not in LAYERS:
        raise AssertionError(f"{module}: not in a known layer; add it to LAYERS and docs/architecture.md")
    return LAYERS[part]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up a layer. commands/ is the top library layer, so a library module importing a command
    module is one of them."""
    return [f"{module} (layer {layer_of(module)}) imports {dep} (layer {layer_of(dep)})"
            for module, deps in sorted(graph.items()) for dep in sorted(deps) if layer_of(dep) > layer_of(module)]


def test_the_package_has_no_import_cycle_and_layers_point_down():
    graph = package_imports(PKG)
    assert len(graph) > 30, "the walker found too few modules"
    assert "rollout8.runspec.render" in graph["rollout8.runspec.check"], "the walker misses relative imports"
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"
    assert layer_violations(graph) == []


def test_the_walker_sees_a_deliberate_cycle_and_an_upward_import(tmp_path):
    """The checks above can fail: a copy of the package with one cycle and one library->command import."""
    import shutil

    copy = tmp_path / "rollout8"
    shutil.copytree(PKG, copy)
    render = copy / "runspec" / "render.py"
    render.write_text(render.read_text() + "\n\ndef _late():\n    from .check import run_checks  # noqa\n")
    verdict = copy / "results" / "verdict.py"
    verdict.write_text(verdict.read_text() + "\n\ndef _cli():\n    from ..commands import logs  # noqa\n")
    graph = package_imports(copy)
    cycle = find_cycle(graph)
    assert cycle and {"rollout8.runspec.check", "rollout8.runspec.render"} <= set(cycle)
    assert any("rollout8.results.verdict" in v and "commands" in v for v in layer_violations(graph))


def test_every_command_has_its_own_module_named_after_it():
    from rollout8.cli import COMMANDS, command_module

    files = {p.stem for p in (PKG / "commands").glob("*.py")} - {"__init__"}
    assert files == {name.replace("-", "_") for name in COMMANDS}
    for name in COMMANDS:
        tree = ast.parse((PKG / "commands" / f"{name.replace('-', '_')}.py").read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"add_arguments", "run"} <= defined, command_module(name)


def test_no_library_module_defines_argument_parsing():
    for path in PKG.rglob("*.py"):
        if "commands" in path.parts or path.name in ("cli.py",):
            continue
        defined = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert "add_arguments" not in defined, f"{path.relative_to(REPO)}: command handling belongs in commands/"


@pytest.mark.parametrize("pattern, where", [
    (r"def \w*sha256\w*\(|while block := |iter\(lambda: \w+\.read\(", "the sha256-of-a-file helper"),
    (r"os\.replace\(", "the atomic write / publish"),
    (r"hashlib\.", "the sha256 helpers (sha256_file, sha256_bytes, sha256_json)"),
    (r"yaml\.(safe_)?load\b|SafeLoader|object_pairs_hook", "the strict YAML / JSON reader"),
    (r"def build_env\b|def node_env\b", "the node environment builder"),
])
def test_one_definition_of_each_shared_helper(pattern, where):
    out = subprocess.run(["git", "grep", "-nE", pattern, "--", "src"], cwd=REPO, capture_output=True, text=True)
    files = {line.split(":", 1)[0] for line in out.stdout.splitlines()}
    expected = {"src/rollout8/runspec/render.py"} if "env" in where else \
        {"src/rollout8/yamlio.py"} if "strict" in where else {"src/rollout8/fileutil.py"}
    assert files == expected, f"{where}: {out.stdout}"


MAX_MODULE_LINES = 500


def test_no_module_is_longer_than_500_lines():
    """A module past 500 lines holds more than one responsibility: split it (runspec/check.py was 603)."""
    long = {str(p.relative_to(REPO)): n for p in sorted(PKG.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these by responsibility: {long}"


def test_every_pydantic_model_derives_from_the_strict_base():
    """One place sets extra="forbid" (rollout8.models): no model of the package sets its own model_config or
    derives from BaseModel directly, so none can silently drop an unknown field."""
    hits = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "models.py" and path.parent == PKG:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b) for b in node.bases}
                if bases & {"BaseModel", "pydantic.BaseModel"} or any(
                        isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "model_config" for t in s.targets)
                        for s in node.body):
                    hits.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name}")
    assert hits == []


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a Python file that are not docstrings (paths a program could open or run)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            docstrings.add(id(node.body[0].value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def reaches_tests(text: str) -> bool:
    """A path-like string (no spaces: messages do not count) naming tests/ or a file under it."""
    return not any(c.isspace() for c in text) and (text == "tests" or text.startswith("tests/") or "/tests/" in text)


def test_nothing_under_tests_is_reached_by_the_product():
    """src/, bench/ and virtual/ never name a path under tests/ in code, and the demo's make recipe neither."""
    hits = []
    for folder in ("src", "bench", "virtual"):
        for path in sorted((REPO / folder).rglob("*.py")):
            hits += [f"{path.relative_to(REPO)}:{line}: {s!r}" for line, s in _code_strings(path) if reaches_tests(s)]
    assert hits == []
    assert reaches_tests("tests") and reaches_tests("/tests/engine/x.py") and not reaches_tests("runs tests/engine")
    import os

    recipe = subprocess.run(["make", "-n", "demo", "demo-down", "bench"], cwd=REPO, capture_output=True, text=True,
                            env=dict(os.environ, MAKEFLAGS="")).stdout
    assert "virtual/" in recipe and "tests/" not in recipe, recipe


def test_a_recipe_line_that_runs_make_runs_nothing_else():
    """GNU make runs a recipe line naming $(MAKE) even under `make -n`, so that the sub-make can print its own: any
    other command on that line runs for real. `make -n demo` (above) once started the whole demo that way, on the
    shared Docker daemon, beside the cluster a rehearsal was using."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.startswith("\t") and "MAKE)" in line]
    assert lines, "no recipe runs $(MAKE): the rule below is then empty, update this test"
    mixed = [line for line in lines if any(sep in line for sep in (";", "&", "|"))]
    assert mixed == [], mixed
