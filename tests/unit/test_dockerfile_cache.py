"""Cache follows change: which build steps of docker/Dockerfile a change of each versions.lock.yaml entry invalidates.

Derived, not listed: for every leaf of the lock, the test changes it, computes what the build sees change (the build
args `rollout8 lock --build-args` gives, and the files: versions.lock.yaml itself and the hashed Python lock's layer
files whose recorded inputs change), and walks the Dockerfile the way BuildKit's cache does:
- a RUN misses when an ARG in scope in its stage changed (every RUN sees the stage's ARGs as its environment: the
  Docker documentation's "ARG variables impact the build cache"), when a bind mount's source changed (a context path,
  or a stage that missed), or when anything before it in its stage missed;
- COPY/ADD miss when a source changed (context path or --from stage); any instruction misses when it expands a
  changed ARG; a stage misses from its start when the stage or image it is FROM missed or its FROM expands a changed
  ARG.
Then it asserts the intended order: pytest or rollout8's code reach only the bundle stages (those on ${STACK_IMAGE}),
and a code edit never reinstalls pytest; ray and flash-llm-rl reach the stack stage only from the step that installs
them; the vLLM-Ascend kernel build step misses exactly on a vLLM, vLLM-Ascend, torch, CANN (or what is below all of
them: Python, the base image, the SoC the kernels are compiled for) change.

tests/unit/test_dockerfile_cache.py::test_the_old_dockerfile_fails_it keeps the proof that it fails on the
Dockerfile before the change (git history): ARGs declared at the top of the stack stage and one constraints string.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from dockerfile_model import Step, parse  # tests/support

from rollout8 import pylock
from rollout8.lock import ARCHES, Lock

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
LOCK_FILE = ROOT / "versions.lock.yaml"
LABEL_ONLY = {"ROLLOUT8_LOCK_DIGEST"}  # every entry changes it; only the last LABEL reads it
KERNEL_MARK = "COMPILE_CUSTOM_KERNELS=1"
# Lock entries allowed to rebuild the custom kernels (and required to, when they change a build input).
KERNEL_ENTRIES = ("python", "base_image.", "cann.", "pypi.torch", "pypi.torch_npu", "git.vllm.", "git.vllm-ascend.",
                  "indexes.torch_x86_64", "soc_version")
VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


# ------------------------------------------------------------------------------------------------ the model
# Step, Stage, instructions and parse: the Dockerfile as stages of steps (tests/support/dockerfile_model.py).


def _touched(path: str, changed_files: set[str]) -> bool:
    path = path.rstrip("/")
    return any(f == path or f.startswith(path + "/") or fnmatch.fnmatch(f, path) for f in changed_files)


def invalidated(text: str, args: set[str], files: set[str]) -> dict[tuple[str, int], Step]:
    """Every step a change of build args `args` and context files `files` makes miss the cache."""
    global_args, stages = parse(text)
    stage_dirty: dict[str, bool] = {}
    missed: dict[tuple[str, int], Step] = {}
    for stage in stages:
        base = stage.base
        refs = set(VAR.findall(base))
        for ref in refs:  # FROM ${BASE_IMAGE}: the global ARG's default names a stage or an image
            base = base.replace(f"${{{ref}}}", global_args.get(ref, "")).replace("$" + ref, global_args.get(ref, ""))
        dirty = bool(refs & args) or stage_dirty.get(base, False)
        changed_scope: set[str] = set()
        for step in stage.steps:
            if step.keyword == "ARG":
                name, _, default = step.text.partition("=")
                if name in args or set(VAR.findall(default)) & (args | changed_scope):
                    changed_scope.add(name)
                continue
            uses = set(VAR.findall(step.text)) & changed_scope
            if step.keyword == "RUN":
                dirty = dirty or bool(changed_scope)
                for mount in re.findall(r"--mount=(\S+)", step.text):
                    opts = dict(kv.partition("=")[::2] for kv in mount.split(","))
                    if opts.get("type") != "bind":
                        continue
                    if "from" in opts:
                        dirty = dirty or stage_dirty.get(opts["from"], False)
                    else:
                        dirty = dirty or _touched(opts.get("source", ""), files)
            elif step.keyword in ("COPY", "ADD"):
                words = step.text.split()
                frm = [w.split("=", 1)[1] for w in words if w.startswith("--from=")]
                sources = [w for w in words[:-1] if not w.startswith("--")]
                if frm:
                    dirty = dirty or stage_dirty.get(frm[0], False)
                else:
                    dirty = dirty or any(_touched(s, files) for s in sources)
            dirty = dirty or bool(uses)
            if dirty:
                missed[(stage.name, step.index)] = step
        stage_dirty[stage.name] = dirty
    return missed


# ------------------------------------------------------------------------------------------------ the lock's changes

def leaves(data, path=""):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, f"{path}.{key}" if path else str(key))
    else:
        yield path, data


def changed_value(path: str, value):
    """Another valid value for one lock leaf."""
    if isinstance(value, list):
        return [*value, "six"]
    if path == "python":
        return "3.11"
    if path == "schema":
        return None
    if path == "soc_version":
        return value + "X"
    if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", value):  # a commit id; python_lock's record of a layer file
        return value[:-1] + ("0" if value[-1] != "0" else "1")
    if path.endswith(".sha256"):
        return "0" * 64
    if path == "base_image.digest":
        return "sha256:" + "0" * 64
    if re.fullmatch(r"\d+(\.\d+)*", value):
        return value + ".1"
    return value + "x"


def set_leaf(data: dict, path: str, value) -> dict:
    data = copy.deepcopy(data)
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value
    return data


def lock_entries() -> list[str]:
    data = yaml.safe_load(LOCK_FILE.read_text())
    return [p for p, v in leaves(data) if changed_value(p, v) is not None]


def old_build_args(lock: Lock) -> dict[str, str]:
    """The build args `rollout8 lock --build-args` gave at OLD_DOCKERFILE_COMMIT: the same plus the constraints
    string of every PyPI pin and the unpinned deps (the Dockerfile then resolved those at build time)."""
    args = lock.build_args()
    args["PIP_CONSTRAINTS"] = " ".join(lock.constraint_lines())
    for name, reqs in lock.unpinned_deps.items():
        args[f"{re.sub(r'[^A-Za-z0-9]+', '_', name).upper()}_DEPS"] = " ".join(reqs)
    return args


@functools.cache
def what_changes(entry: str, old: bool = False) -> tuple[set[str], set[str]]:
    """(build args, context files) that differ when `entry` of the lock changes (old: as the lock's build args
    were at OLD_DOCKERFILE_COMMIT)."""
    data = yaml.safe_load(LOCK_FILE.read_text())
    value = dict(leaves(data))[entry]
    before = Lock.model_validate(data)
    new_value = changed_value(entry, value)
    changed = set_leaf(data, entry, new_value)
    if entry == "cann.version":  # the installers' file names carry the version (the lock checks it)
        for kind in changed["cann"]["installers"].values():
            for inst in kind.values():
                inst["file"] = inst["file"].replace(value, new_value)
    after = Lock.model_validate(changed)
    args_of = old_build_args if old else Lock.build_args
    was, now = args_of(before), args_of(after)
    args = {k for k in was.keys() | now.keys() if was.get(k) != now.get(k)}
    files = {"versions.lock.yaml"}
    folder = pylock.requirements_dir(LOCK_FILE)
    for layer in pylock.LAYERS:
        for arch in ARCHES:
            if pylock.inputs_digest(before, folder, layer.name, arch) != pylock.inputs_digest(after, folder,
                                                                                             layer.name, arch):
                files.add(str(pylock.layer_file(folder, layer.name, arch).relative_to(ROOT)))
    return args, files


CODE_CHANGE = ({"ROLLOUT8_VERSION", "ROLLOUT8_REVISION", "ROLLOUT8_CREATED"},
               {"src/rollout8/cli.py", "pyproject.toml"})


# ------------------------------------------------------------------------------------------------ the judgement

def bundle_stages(text: str) -> set[str]:
    """The stages on ${STACK_IMAGE} and those built from them: what `make image STACK_IMAGE=...` builds."""
    _, stages = parse(text)
    names: set[str] = set()
    for stage in stages:
        if stage.base == "${STACK_IMAGE}" or stage.base in names:
            names.add(stage.name)
    return names


def first_step_using(text: str, stage_name: str, arg: str, files: frozenset[str] = frozenset()) -> int:
    """The first step of a stage that reads a build arg, or copies or mounts one of `files` (its lock layer)."""
    _, stages = parse(text)
    stage = next(s for s in stages if s.name == stage_name)
    files = set(files) - {"versions.lock.yaml"}
    return min(s.index for s in stage.steps if s.keyword != "ARG" and (
        re.search(rf"\$\{{?{arg}\b", s.text) or any(_touched(w.split("=")[-1].split(",")[0], files)
                                                     for w in s.text.split())))


def kernel_step(text: str) -> tuple[str, int]:
    _, stages = parse(text)
    return next((s.name, st.index) for s in stages for st in s.steps if KERNEL_MARK in st.text)


def violations(text: str, old: bool = False) -> list[str]:
    """Every way the Dockerfile breaks the intended order, one line each (empty: it keeps it)."""
    out = []
    bundle = bundle_stages(text)
    kernels = kernel_step(text)
    ray_step = first_step_using(text, "stack", "RAY_VERSION", frozenset(what_changes("pypi.ray", old)[1]))
    flash_step = first_step_using(text, "stack", "FLASH_LLM_RL_VERSION",
                                  frozenset(what_changes("pypi.flash-llm-rl", old)[1]))

    def describe(missed):
        return ", ".join(f"{s.stage}#{s.index} {s.keyword} (line {s.line})" for s in missed.values())

    for entry in lock_entries():
        args, files = what_changes(entry, old)
        missed = invalidated(text, args - LABEL_ONLY, files)
        if entry == "pypi.pytest":
            outside = {k: v for k, v in missed.items() if k[0] not in bundle}
            if outside:
                out.append(f"{entry} reaches beyond the bundle stages: {describe(outside)}")
        if entry in ("pypi.ray", "pypi.flash-llm-rl"):
            first = ray_step if entry == "pypi.ray" else flash_step
            early = {k: v for k, v in missed.items()
                     if k[0] not in bundle and not (k[0] == "stack" and k[1] >= first)}
            if early:
                out.append(f"{entry} reaches steps before the one that installs it: {describe(early)}")
        allowed = entry.startswith(KERNEL_ENTRIES) or entry in KERNEL_ENTRIES
        hits_kernels = kernels in missed
        if hits_kernels and not allowed:
            out.append(f"{entry} rebuilds the custom kernels ({kernels[0]}#{kernels[1]})")
        if allowed and not hits_kernels and (args - LABEL_ONLY or files - {"versions.lock.yaml"}):
            out.append(f"{entry} changes a kernel build input but the kernel step would stay cached")
    args, files = CODE_CHANGE
    missed = invalidated(text, args, files)
    outside = {k: v for k, v in missed.items() if k[0] not in bundle}
    if outside:
        out.append(f"a code change of rollout8 reaches beyond the bundle stages: {describe(outside)}")
    pytest_steps = [(st.stage, st.index) for s in parse(text)[1] for st in s.steps
                    if st.keyword == "RUN" and "PYTEST_VERSION" in st.text]
    if any(k in missed for k in pytest_steps):
        out.append("a code change of rollout8 reinstalls pytest")
    return out


# ------------------------------------------------------------------------------------------------ tests

def test_every_lock_entry_reaches_only_its_steps():
    assert violations(DOCKERFILE.read_text()) == []


def test_the_model_sees_real_changes():
    """The judgement can fail: the changes the order allows do miss where they must."""
    text = DOCKERFILE.read_text()
    for entry, arg in (("pypi.ray", "RAY_VERSION"), ("pypi.flash-llm-rl", "FLASH_LLM_RL_VERSION"),
                       ("pypi.pytest", "PYTEST_VERSION")):
        args, files = what_changes(entry)
        assert arg in args
        missed = invalidated(text, args - LABEL_ONLY, files)
        stage = "stack" if arg != "PYTEST_VERSION" else "patched"
        assert (stage, first_step_using(text, stage, arg)) in missed, entry
    for entry in ("git.vllm.commit", "git.vllm-ascend.commit", "pypi.torch", "cann.version"):
        args, files = what_changes(entry)
        assert kernel_step(text) in invalidated(text, args - LABEL_ONLY, files), entry
    # a code edit rebuilds the bundle's own install step, and the label step reads every pin
    args, files = CODE_CHANGE
    assert any("rollout8-*.whl" in s.text for s in invalidated(text, args, files).values())


def test_a_ray_bump_rewrites_only_the_layers_after_stack():
    _, files = what_changes("pypi.ray")
    layers = {Path(f).name.rsplit("-", 1)[0] for f in files if f.startswith("docker/requirements/")}
    assert layers == {"verl", "bundle", "bundle-build"}


def test_the_old_dockerfile_fails_it():
    """The Dockerfile before issue 15 (all stack ARGs at the top of the stage, one constraints string with the
    pytest, ray and flash-llm-rl pins, pytest installed with the bundle's code) breaks the order; this is what the
    test above would have said of it."""
    try:
        old = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_DOCKERFILE_COMMIT}:docker/Dockerfile"],
                             capture_output=True, text=True, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip(f"no git history with commit {OLD_DOCKERFILE_COMMIT} here (a source tarball)")
    found = violations(old, old=True)
    assert any(v.startswith("pypi.pytest reaches beyond the bundle stages") for v in found), found
    assert any(v.startswith("pypi.ray reaches steps before") for v in found), found
    assert any(v.startswith("pypi.ray rebuilds the custom kernels") for v in found), found
    assert "a code change of rollout8 reinstalls pytest" in found, found


OLD_DOCKERFILE_COMMIT = "a0e4866"
