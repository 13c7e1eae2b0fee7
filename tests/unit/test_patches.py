"""The bundle's patches apply to the pinned upstream files, once, and drift is refused with a clear message.

verl: the patch targets verl/__init__.py at the verl pin (commit 51d2104, see versions.lock.yaml). That file is
byte-identical to verl/__init__.py in the verl 0.6.1 wheel on PyPI: checked by reading the file at the pinned
commit from a mirror of github.com/volcengine/verl (`git show <pin>:verl/__init__.py`) and comparing it with the
wheel's copy (same git blob 3fb53c2, same sha256 below). GitHub is not reachable from CI, PyPI is, so CI applies
the patch to the wheel's file and asserts the sha256 first, which proves the stand-in is still the pinned file.

flash_rl: the patches target the flash-llm-rl wheel at the lock's pin, downloaded from PyPI by the test.
Both wheels are cached under .cache/wheels (see upstream_wheels.py); the .venv's installed copies are not touched.
"""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import upstream_wheels as uw

from rollout8.errors import CheckFailed, PatchError
from rollout8.node import patches

# sha256 of verl/__init__.py at the verl pin (== verl 0.6.1's), see the module docstring.
PINNED_VERL_INIT_SHA256 = "7dfdea6a41b22a2958e90803063f59e8828dcbd5932beb3442acb3e8fab0b6e3"
MARKER = "# rollout8-patch:"


# verl_pristine, flashrl_pristine: tests/unit/conftest.py
@pytest.fixture
def verl_tree(verl_pristine, tmp_path) -> Path:
    return uw.copy_tree(verl_pristine, tmp_path / "verl-src")


@pytest.fixture
def flashrl_tree(flashrl_pristine, tmp_path) -> Path:
    return uw.copy_tree(flashrl_pristine, tmp_path / "site-packages")


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.py"))}


def test_stand_in_is_the_pinned_verl_init(verl_pristine):
    data = (verl_pristine / "verl" / "__init__.py").read_bytes()
    assert hashlib.sha256(data).hexdigest() == PINNED_VERL_INIT_SHA256


def test_every_patch_has_a_header_and_marks_its_lines():
    found = patches.find_patches()
    assert {p.component for p in found} == {"verl", "flash_rl"}
    for p in found:
        text = p.path.read_text()
        header = text.split("diff --git", 1)[0]
        assert p.summary.startswith("rollout8 patch: "), p.name
        assert "Applies to:" in header and "What it fixes" in header, p.name
        marker = f"{MARKER} {p.summary.removeprefix('rollout8 patch: ')}"
        added = [ln for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
        assert added and any(marker in ln for ln in added), f"{p.name}: no added line carries {marker!r}"


def test_verl_patch_applies_once_and_puts_flash_rl_first(verl_tree):
    before = patches.patch_status(verl_tree, "verl")
    assert [r.state for r in before] == [patches.NOT_APPLIED]

    first = patches.apply_patches(verl_tree, "verl")
    assert [r.action for r in first] == ["applied now"]
    patched = (verl_tree / "verl" / "__init__.py").read_bytes()

    second = patches.apply_patches(verl_tree, "verl")
    assert [r.action for r in second] == ["already applied (no-op)"]
    assert (verl_tree / "verl" / "__init__.py").read_bytes() == patched
    assert [r.state for r in patches.patch_status(verl_tree, "verl")] == [patches.APPLIED]

    tree = ast.parse(patched)
    first_two = [ast.unparse(node) for node in tree.body[:2]]
    assert first_two == ["import flash_rl", "import rollout8.activate"]


def test_verl_drift_is_refused_and_nothing_changes(verl_tree):
    init = verl_tree / "verl" / "__init__.py"
    init.write_text(init.read_text().replace("import importlib\n", "import importlib  # local edit\n"))
    drifted = init.read_bytes()
    [state] = patches.patch_status(verl_tree, "verl")
    assert state.state == patches.DRIFTED
    with pytest.raises(PatchError) as err:
        patches.apply_patches(verl_tree, "verl")
    msg = str(err.value)
    assert "verl/0001-import-flash-rl.patch" in msg
    assert str(init) in msg
    assert "versions.lock.yaml" in msg and "Nothing was changed" in msg
    assert init.read_bytes() == drifted


def test_flashrl_patches_apply_once(flashrl_tree):
    pristine = _snapshot(flashrl_tree)
    assert {r.state for r in patches.patch_status(flashrl_tree, "flash_rl")} == {patches.NOT_APPLIED}

    shipped = patches.find_patches("flash_rl")
    assert [p.path.name for p in shipped][:6] == ["0001-int8-quantizer-device.patch",
                                                  "0002-reload-on-param-device.patch", "0003-setup-append-bf16.patch",
                                                  "0004-int8-requant-in-row-blocks.patch",
                                                  "0005-record-column-parallel-loader.patch",
                                                  "0006-sync-gc-only-when-params-replaced.patch"]
    first = patches.apply_patches(flashrl_tree, "flash_rl")
    assert [r.action for r in first] == ["applied now"] * len(shipped)
    patched = _snapshot(flashrl_tree)
    changed = sorted(k for k in pristine if pristine[k] != patched[k])
    assert changed == sorted({f for p in shipped for f in p.files})
    assert {"flash_rl/commands.py", "flash_rl/flash_quantization.py", "flash_rl/vllm_patch.py"} <= set(changed)
    for name in changed:
        assert MARKER.encode() in patched[name]

    second = patches.apply_patches(flashrl_tree, "flash_rl")
    assert [r.action for r in second] == ["already applied (no-op)"] * len(shipped)
    assert _snapshot(flashrl_tree) == patched
    for name in changed:  # the patched files still compile
        compile(patched[name], name, "exec")


def test_flashrl_drift_stops_before_any_change(flashrl_tree):
    quant = flashrl_tree / "flash_rl" / "flash_quantization.py"
    quant.write_text(quant.read_text().replace("def linear_quantize(name, from_p, profile):",
                                               "def linear_quantize(name, from_p, profile, extra=None):"))
    before = _snapshot(flashrl_tree)
    with pytest.raises(PatchError, match=r"flash_rl/0001-int8-quantizer-device\.patch .*flash_quantization\.py"):
        patches.apply_patches(flashrl_tree, "flash_rl")
    assert _snapshot(flashrl_tree) == before  # the later patches would apply, but nothing is half-done


def test_target_without_the_package_names_the_fix(tmp_path):
    with pytest.raises(PatchError, match=r"has no flash_rl/ directory.*contains flash_rl/"):
        patches.patch_status(tmp_path, "flash_rl")


def test_target_inside_another_git_work_tree(flashrl_pristine, tmp_path):
    """A site-packages inside some git checkout (a venv in a repo): git apply must still look at the target."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    target = uw.copy_tree(flashrl_pristine, tmp_path / "venv" / "site-packages")
    results = patches.apply_patches(target, "flash_rl")
    assert [r.action for r in results] == ["applied now"] * len(patches.find_patches("flash_rl"))
    assert MARKER in (target / "flash_rl" / "commands.py").read_text()


def test_cli_apply_check_and_exit_codes(verl_pristine, flashrl_pristine, tmp_path):
    target = tmp_path / "site-packages"
    uw.copy_tree(flashrl_pristine, target)
    uw.copy_tree(verl_pristine / "verl", target / "verl")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "rollout8", "patches", *args], capture_output=True, text=True,
                              timeout=120)

    n = len(patches.find_patches())  # verl's and flash_rl's
    check = cli("check", "--target", str(target))
    assert check.returncode == CheckFailed.exit_code
    assert check.stdout.count("not applied") == n
    assert "rollout8 patches apply" in check.stderr

    first = cli("apply", "--target", str(target))
    assert first.returncode == 0, first.stderr
    assert f"{n} applied now, 0 already applied" in first.stdout
    second = cli("apply", "--target", str(target))
    assert second.returncode == 0 and f"0 applied now, {n} already applied" in second.stdout

    ok = cli("check", "--target", str(target))
    assert ok.returncode == 0 and f"all {n} patches applied" in ok.stdout

    commands = target / "flash_rl" / "commands.py"
    commands.write_text(commands.read_text().replace("'bf16'], \\", "'bf16', 'x'], \\"))
    drift = cli("check", "--target", str(target), "--component", "flash_rl")
    assert drift.returncode == CheckFailed.exit_code
    assert "drifted" in drift.stdout and "0003-setup-append-bf16.patch" in drift.stdout
    refused = cli("apply", "--target", str(target), "--component", "flash_rl")
    assert refused.returncode == PatchError.exit_code
    assert "0003-setup-append-bf16.patch" in refused.stderr and str(commands) in refused.stderr


def _diff(tmp_path: Path, before: str, after: str) -> str:
    a, b = tmp_path / "a" / "flash_rl", tmp_path / "b" / "flash_rl"
    for folder, text in ((a, before), (b, after)):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hook.py").write_text(text)
    out = subprocess.run(["git", "diff", "--no-index", "a/flash_rl/hook.py", "b/flash_rl/hook.py"], cwd=tmp_path,
                         capture_output=True, text=True, check=False).stdout
    return out.replace("a/a/flash_rl", "a/flash_rl").replace("b/b/flash_rl", "b/flash_rl")


def test_a_later_patch_may_change_an_earlier_ones_context(tmp_path):
    """0006 changes a line that 0002 keeps as context (FlashRL's sync hook): git apply --check alone then finds 0002
    neither applied nor applicable once both are in. The series is judged as a stack: applies once, re-runs are
    no-ops, and a tree with only the first patch gets only the second."""
    lines = [f"line{i} = {i}\n" for i in range(12)]
    base = "".join(lines)
    first = base.replace("line6 = 6\n", "line6 = 6  # rollout8-patch: one\n")
    second = first.replace("line5 = 5\n", "line5 = 55  # rollout8-patch: two\n")  # inside the first's context
    root = tmp_path / "patches" / "flash_rl"
    root.mkdir(parents=True)
    header = "rollout8 patch: {0}\n\nApplies to: hook.py\nWhat it fixes: a test\n\n"
    (root / "0001-one.patch").write_text(header.format("one") + _diff(tmp_path / "d1", base, first))
    (root / "0002-two.patch").write_text(header.format("two") + _diff(tmp_path / "d2", first, second))

    def tree(text):
        target = tmp_path / f"t{len(list(tmp_path.glob('t*')))}"
        (target / "flash_rl").mkdir(parents=True)
        (target / "flash_rl" / "hook.py").write_text(text)
        return target

    patches_root = tmp_path / "patches"
    pristine = tree(base)
    assert [r.state for r in patches.patch_status(pristine, "flash_rl", patches_root)] == [patches.NOT_APPLIED] * 2
    assert [r.action for r in patches.apply_patches(pristine, "flash_rl", patches_root)] == ["applied now"] * 2
    assert (pristine / "flash_rl" / "hook.py").read_text() == second
    again = patches.apply_patches(pristine, "flash_rl", patches_root)
    assert [r.action for r in again] == ["already applied (no-op)"] * 2
    assert [r.state for r in patches.patch_status(pristine, "flash_rl", patches_root)] == [patches.APPLIED] * 2

    older = tree(first)  # an image built before the second patch existed
    assert [r.state for r in patches.patch_status(older, "flash_rl", patches_root)] == [patches.APPLIED,
                                                                                         patches.NOT_APPLIED]
    assert [r.action for r in patches.apply_patches(older, "flash_rl", patches_root)] == [
        "already applied (no-op)", "applied now"]
    assert (older / "flash_rl" / "hook.py").read_text() == second

    edited = tree(base.replace("line6 = 6\n", "line6 = 7\n"))
    with pytest.raises(PatchError, match=r"0001-one\.patch"):
        patches.apply_patches(edited, "flash_rl", patches_root)
    assert (edited / "flash_rl" / "hook.py").read_text() == base.replace("line6 = 6\n", "line6 = 7\n")
