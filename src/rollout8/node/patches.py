"""`rollout8 patches`: apply or check the bundle's patches (patches/<component>/NNNN-*.patch).

A patch is a git-format diff whose paths are relative to the directory that holds the package
(`verl/...`, `flash_rl/...`), so one `--target` serves a source checkout or a site-packages dir.
Each patch is in one of three states on a target, decided with `git apply --check`:

- applied:     the reverse patch applies cleanly (the change is there);
- not applied: the patch applies cleanly (the upstream file is as the patch expects);
- drifted:     neither (a different upstream version, or the file was edited by hand).

Patches of one component form a series applied in name order, and a later one may change lines that an earlier
one keeps as context (FlashRL's weight-sync hook carries several): with both applied, `git apply --check` alone
finds the earlier one neither applied nor applicable. So the series is judged as a stack, on a scratch copy of
the files it touches: the applied patches are peeled off from the last to the first, then each is judged on the
state its predecessors leave, as `apply` would meet it.

`apply` checks every selected patch first and changes nothing if one has drifted; then it applies
the ones not applied yet. A second `apply` is a no-op and says so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import PatchError
from ..paths import patches_dir

# component name -> the package directory that must exist under --target
COMPONENTS: dict[str, str] = {"verl": "verl", "flash_rl": "flash_rl"}
ALL = "all"

APPLIED = "applied"
NOT_APPLIED = "not applied"
DRIFTED = "drifted"

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Patch:
    component: str
    path: Path

    @property
    def name(self) -> str:
        return f"{self.component}/{self.path.name}"

    @property
    def files(self) -> list[str]:
        """The files the patch changes, relative to the target."""
        return [m.group(2) for m in _DIFF_HEADER.finditer(self.path.read_text())]

    @property
    def summary(self) -> str:
        """The first line of the header ("rollout8 patch: <marker name>")."""
        for line in self.path.read_text().splitlines():
            if line.strip():
                return line.strip()
        return self.path.name


@dataclass(frozen=True)
class PatchResult:
    patch: Patch
    target: Path
    state: str  # APPLIED, NOT_APPLIED or DRIFTED (after `apply`: the state now)
    action: str = ""  # what `apply` did: "applied now", "already applied (no-op)", or "" for a check
    detail: str = ""  # for DRIFTED: git's own explanation (first error line)

    @property
    def ok(self) -> bool:
        return self.state == APPLIED

    def line(self) -> str:
        what = self.action or self.state
        files = ", ".join(self.patch.files)
        text = f"{what:<24} {self.patch.name}  ({files})"
        if self.detail:
            text += f": {self.detail}"
        return text


def find_patches(component: str = ALL, root: Path | None = None) -> list[Patch]:
    """The bundle's patches for one component (or all), in apply order."""
    root = Path(root) if root is not None else patches_dir()
    names = _components(component)
    found = []
    for name in names:
        folder = root / name
        for path in sorted(folder.glob("*.patch")):
            found.append(Patch(name, path))
    if not found:
        raise PatchError(f"no patches for {component!r} under {root}: the bundle is incomplete "
                         "(reinstall rollout8, or set ROLLOUT8_HOME to the unpacked bundle)")
    return found


def patch_status(target: Path, component: str = ALL, root: Path | None = None) -> list[PatchResult]:
    """The state of every selected patch on `target`. Changes nothing."""
    return _series_states(find_patches(component, root), target)


def _series_states(patches: list[Patch], target: Path) -> list[PatchResult]:
    """The states of a series (in apply order), each judged where `apply` meets it: on a scratch copy of the files,
    the applied patches are reversed from the last to the first (a later one restores the context of an earlier),
    then the series is replayed from the first: an applied patch is put back, an unapplied one is checked and
    applied on the copy so that the next one sees its predecessors."""
    states: dict[int, PatchResult] = {}
    by_component: dict[str, list[int]] = {}
    for i, patch in enumerate(patches):
        by_component.setdefault(patch.component, []).append(i)
    for component, indexes in by_component.items():
        real = _check_target(Path(target), component)
        with tempfile.TemporaryDirectory(prefix="rollout8-patches-") as tmp:
            scratch = Path(tmp) / "target"
            (scratch / COMPONENTS[component]).mkdir(parents=True)
            for rel in sorted({f for i in indexes for f in patches[i].files}):
                if (real / rel).is_file():
                    (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(real / rel, scratch / rel)
            applied = set()
            for i in reversed(indexes):
                if _git_apply(patches[i], scratch, "--reverse").returncode == 0:
                    applied.add(i)
            for i in indexes:
                if i in applied:
                    states[i] = PatchResult(patches[i], real, APPLIED)
                    _git_apply(patches[i], scratch)
                    continue
                forward = _git_apply(patches[i], scratch)
                if forward.returncode == 0:
                    states[i] = PatchResult(patches[i], real, NOT_APPLIED)
                else:
                    states[i] = PatchResult(patches[i], real, DRIFTED, detail=_first_error(forward))
    return [states[i] for i in range(len(patches))]


def apply_patch(patch: Patch, target: Path) -> PatchResult:
    """Apply one patch on its own (a subset of the series: tests) unless applied; PatchError if it drifted."""
    [state] = _series_states([patch], target)
    if state.state == DRIFTED:
        raise PatchError(_drift_message(state))
    if state.state == APPLIED:
        return PatchResult(patch, state.target, APPLIED, action="already applied (no-op)")
    return _apply_checked(state)


def apply_patches(target: Path, component: str = ALL, root: Path | None = None) -> list[PatchResult]:
    """Apply every selected patch once. Checks all first: on drift, raises PatchError and changes nothing."""
    patches = find_patches(component, root)
    states = _series_states(patches, target)
    drifted = [s for s in states if s.state == DRIFTED]
    if drifted:
        raise PatchError(" | ".join(_drift_message(s) for s in drifted))
    results = []
    for state in states:
        if state.state == APPLIED:
            results.append(PatchResult(state.patch, state.target, APPLIED, action="already applied (no-op)"))
        else:
            results.append(_apply_checked(state))
    return results


def _apply_checked(state: PatchResult) -> PatchResult:
    done = _git_apply(state.patch, state.target)
    if done.returncode != 0:  # checked a moment ago, so only a concurrent edit gets here
        raise PatchError(f"patch {state.patch.name} failed on {state.target}: {_first_error(done)}")
    return PatchResult(state.patch, state.target, APPLIED, action="applied now")


def _components(component: str) -> list[str]:
    if component == ALL:
        return list(COMPONENTS)
    if component not in COMPONENTS:
        raise PatchError(f"unknown component {component!r}: choose one of {', '.join([*COMPONENTS, ALL])}")
    return [component]


def _check_target(target: Path, component: str) -> Path:
    target = target.expanduser().resolve()
    package = COMPONENTS[component]
    if not (target / package).is_dir():
        raise PatchError(f"--target {target} has no {package}/ directory: for {component}, --target is the "
                         f"directory that contains {package}/ (a source checkout or site-packages)")
    return target


def _git_apply(patch: Patch, target: Path, *flags: str) -> subprocess.CompletedProcess:
    git = shutil.which("git")
    if git is None:
        raise PatchError("git is not installed: `rollout8 patches` uses `git apply` (apt-get install git)")
    env = dict(os.environ)
    # Without a ceiling, a target inside some git work tree (a venv in a checkout) makes git apply take paths
    # relative to that tree's root and silently skip every file. With it, git looks no further up than target.
    env["GIT_CEILING_DIRECTORIES"] = str(target.parent)
    result = subprocess.run([git, "apply", "--verbose", *flags, str(patch.path)], cwd=target, env=env,
                            capture_output=True, text=True, check=False)
    if result.returncode == 0 and "Skipped patch" in result.stdout + result.stderr:
        # never report success for a patch git did not look at
        return subprocess.CompletedProcess(result.args, 1, result.stdout,
                                           f"error: git skipped the patch in {target}\n{result.stderr}")
    return result


def _first_error(result: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in (result.stderr or "").splitlines() if ln.strip()]
    failed = [ln for ln in lines if ln.startswith("error:")]
    return (failed[-1] if failed else (lines[-1] if lines else f"git apply exited {result.returncode}"))


def _drift_message(state: PatchResult) -> str:
    files = ", ".join(str(state.target / f) for f in state.patch.files)
    return (f"patch {state.patch.name} neither applies to nor is applied in {files} ({state.detail}). "
            f"The file differs from the pinned upstream version the patch was written for: install the version "
            f"in versions.lock.yaml, or, if the pin moved on purpose, redo the change the patch header describes "
            f"on the new file and regenerate the patch. Nothing was changed.")
