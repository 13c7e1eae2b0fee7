"""Nothing floats: the hashed Python lock (docker/requirements/) and how docker/Dockerfile installs from it.

- every layer file exists for aarch64 and x86_64, is current (the inputs sha256 in its header is what the lock and
  the layer's .in give now), and every name in it is hashed and none is a mission pin;
- `rollout8 lock --check` reports a stale layer (a ray bump without `make python-lock`);
- every pip install of the Dockerfile and its scripts reads a hashed layer (--require-hashes --no-deps), or installs
  a mission pin by its exact build arg, or a wheel built in the build stages (--no-deps); every wheel build is
  --no-deps --no-build-isolation (an isolated build resolves its build requirements at build time);
- the runtime stages keep no compiler and no -dev package; TARGETARCH, not `uname -m`, decides the architecture;
  the OCI labels carry the bundle's version, revision, source and creation time.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from dockerfile_model import instructions, parse  # tests/support

from rollout8 import pylock
from rollout8.errors import LockError
from rollout8.lock import ARCHES, load_lock, normalize, set_base_digest
from rollout8.pylock import unpinned_report

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
LOCK_FILE = ROOT / "versions.lock.yaml"
RUNTIME_STAGES = ("os-base", "cann-base", "stack", "patched", "bundle")
BUILD_TOOLS = re.compile(r"^(gcc|g\+\+|cpp|make|cmake|gfortran|clang.*|.*-dev)$")


def old(path: str, commit: str = "a0e4866") -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True, text=True,
                              check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip(f"no git history with commit {commit} here")


# ------------------------------------------------------------------------------------------------ the lock files

@pytest.mark.parametrize("arch", ARCHES)
def test_every_name_is_a_mission_pin_or_hashed(arch):
    lock = load_lock(LOCK_FILE)
    folder = pylock.requirements_dir(LOCK_FILE)
    pinned = pylock.pinned_names(lock)
    seen: dict[str, str] = {}
    for layer in pylock.LAYERS:
        path = pylock.layer_file(folder, layer.name, arch)
        entries = pylock.parse_layer(path)
        assert entries or layer.name == "bundle", f"{path.name} is empty"
        for entry in entries:
            assert entry.name not in pinned, f"{path.name}: {entry.name} is a mission pin"
            assert entry.hashes, f"{path.name}: {entry.name}=={entry.version} has no hash"
            assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in entry.hashes)
            # a layer never repeats what its parents install (a second, different version would be installed)
            ancestors = {x.name for x in pylock.chain(layer.name)[:-1]}
            if entry.name in seen:
                assert seen[entry.name] not in ancestors, f"{entry.name} in {layer.name} and {seen[entry.name]}"
            seen.setdefault(entry.name, layer.name)
    # the runtime chain holds what the stack needs and the tests of the issue name (not a mock: the real files)
    runtime = {e.name for x in pylock.chain("bundle") for e in pylock.parse_layer(pylock.layer_file(folder, x.name,
                                                                                                    arch))}
    for name in ("numpy", "fastapi", "tokenizers", "accelerate", "tensordict", "compressed-tensors", "pluggy"):
        assert normalize(name) in runtime, name


def test_the_layer_files_are_current():
    problems, _ = pylock.status(load_lock(LOCK_FILE), LOCK_FILE)
    assert problems == []


def test_lock_check_reports_a_stale_layer_and_what_still_floats(tmp_path):
    (tmp_path / "docker").mkdir()
    shutil.copytree(ROOT / "docker" / "requirements", tmp_path / "docker" / "requirements")
    lock_file = tmp_path / "versions.lock.yaml"
    lock_file.write_text(LOCK_FILE.read_text().replace('ray: "2.46.0"', 'ray: "2.46.1"'))
    lock = load_lock(lock_file)
    problems, floating = unpinned_report(lock, lock_file)
    stale = sorted(p.split()[2] for p in problems)
    assert stale == sorted(f"{n}-{a}.txt" for n in ("verl", "bundle-build", "bundle") for a in ARCHES), problems
    assert any(line.startswith("base_image.digest: empty") for line in floating)
    assert any("cann.installers sha256 empty" in line for line in floating)
    (tmp_path / "docker" / "requirements" / "stack-x86_64.txt").unlink()
    problems, _ = unpinned_report(lock, lock_file)
    assert any("stack-x86_64.txt missing" in p for p in problems)


def test_a_hash_edited_by_hand_fails_lock_check_and_its_record_changes_the_image_tag(tmp_path, capsys):
    """The lock covers its bytes (issue 45 item 5): a hash edited in a layer file, its version kept, is named by
    `lock --check`; recording it (make python-lock) changes the lock's digest and so the image tag."""
    from rollout8.cli import main
    from rollout8.lock import set_python_lock

    (tmp_path / "docker").mkdir()
    folder = tmp_path / "docker" / "requirements"
    shutil.copytree(ROOT / "docker" / "requirements", folder)
    lock_file = tmp_path / "versions.lock.yaml"
    lock_file.write_text(LOCK_FILE.read_text())
    assert main(["lock", "--lock", str(lock_file), "--check"]) == 0
    capsys.readouterr()
    layer = folder / "stack-aarch64.txt"
    text = layer.read_text()
    first = re.search(r"--hash=sha256:([0-9a-f]{64})", text).group(1)
    layer.write_text(text.replace(first, "0" * 64, 1))
    assert main(["lock", "--lock", str(lock_file), "--check"]) != 0
    out = capsys.readouterr().out
    assert "stack-aarch64.txt holds other names, versions or hashes than versions.lock.yaml records" in out, out
    tag = load_lock(lock_file).image_ref()
    assert set_python_lock(lock_file, pylock.content_digests(folder))
    assert load_lock(lock_file).image_ref() != tag
    assert main(["lock", "--lock", str(lock_file), "--check"]) == 0
    assert not set_python_lock(lock_file, pylock.content_digests(folder))  # a re-run changes nothing


def test_every_layer_file_is_recorded_in_the_lock():
    assert load_lock(LOCK_FILE).python_lock == pylock.content_digests(pylock.requirements_dir(LOCK_FILE))


def test_set_base_digest_fills_the_slot_and_keeps_the_comments(tmp_path):
    lock_file = tmp_path / "versions.lock.yaml"
    lock_file.write_text(LOCK_FILE.read_text())
    digest = "sha256:" + "ab" * 32
    set_base_digest(lock_file, digest)
    assert load_lock(lock_file).base_image.digest == digest
    assert load_lock(lock_file).build_args()["UBUNTU_IMAGE"] == f"ubuntu:22.04@{digest}"
    text = lock_file.read_text()
    assert text.replace(f'"{digest}"', '""') == LOCK_FILE.read_text()
    with pytest.raises(LockError):
        set_base_digest(lock_file, "sha256:short")


# ------------------------------------------------------------------------------------------------ the Dockerfile

def pip_commands(text: str) -> list[str]:
    """Every `pip install` / `pip wheel` command of a shell text (continuations joined), one string each."""
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    text = text.replace("\\\n", " ")
    return [m.group(0) for m in re.finditer(r"pip (install|wheel)\b[^&;|\n]*", text)]


def floating_installs(text: str, pins: set[str]) -> list[str]:
    bad = []
    for cmd in pip_commands(text):
        if "uninstall" in cmd:
            continue
        words = cmd.split()[2:]
        if "--no-deps" not in words:
            bad.append(f"without --no-deps: {cmd}")
            continue
        if words[0] == "wheel" or cmd.split()[1] == "wheel":
            if "--no-build-isolation" not in words:
                bad.append(f"isolated wheel build: {cmd}")
            continue
        if "--require-hashes" in words:
            continue
        # a quoted word is one word ("pytest==${PYTEST_VERSION:?build arg missing: ...}")
        words = [w.strip('"') for w in re.findall(r'"[^"]*"|\S+', cmd)][2:]
        for word in words:
            if word.startswith("-") or word.startswith("--") or word in ("-r", "-c"):
                continue
            word = word.strip('"\'')
            if word.startswith(("/tmp/wheels", "/wheels", "/tmp/rollout8", "/src/")) or word.startswith("$"):
                continue  # built wheels, the sources at their commits, an array of pins (install-torch.sh)
            match = re.fullmatch(r"([A-Za-z0-9_.\[\]-]+)==\$\{([A-Z0-9_]+)(:\?[^}]*)?\}", word)
            if not match or match.group(2) not in pins:
                bad.append(f"not a hashed layer, a pin or a built wheel: {word!r} in {cmd}")
    return bad


def test_nothing_is_resolved_at_build_time():
    lock = load_lock(LOCK_FILE)
    pins = {k for k in lock.build_args() if k.endswith("_VERSION") and k != "PYTHON_VERSION"}
    texts = [DOCKERFILE.read_text(), *(p.read_text() for p in (ROOT / "docker" / "scripts").glob("*.sh"))]
    bad = [b for t in texts for b in floating_installs(t, pins)]
    assert bad == []
    assert floating_installs(old("docker/Dockerfile"), pins), "the old Dockerfile resolved at build time"


def apt_leftovers(text: str) -> list[str]:
    """Build tools a runtime stage installs and does not purge in the same RUN."""
    _, stages = parse(text)
    bad = []
    for stage in stages:
        if stage.name not in RUNTIME_STAGES:
            continue
        for step in stage.steps:
            if step.keyword != "RUN" or "apt-get install" not in step.text:
                continue
            words = set(re.findall(r"[A-Za-z0-9+.-]+", step.text.split("apt-get install", 1)[1].split("&&")[0]))
            tools = {w for w in words if BUILD_TOOLS.match(w)}
            if "tools=(" in step.text:  # installed from an array and purged from it
                purged = "apt-get purge" in step.text and '"${tools[@]}"' in step.text.split("apt-get purge")[1]
                if purged:
                    continue
                tools |= set(re.findall(r"tools=\(([^)]*)\)", step.text)[0].split())
            if tools:
                bad.append(f"{stage.name} (line {step.line}): {' '.join(sorted(tools))}")
    return bad


def test_runtime_stages_keep_no_compiler():
    assert apt_leftovers(DOCKERFILE.read_text()) == []
    assert apt_leftovers(old("docker/Dockerfile")), "the old runtime stages kept gcc and the -dev packages"


def uname_uses(text: str) -> list[str]:
    return [line for line in text.splitlines() if "uname" in line and not line.lstrip().startswith("#")]


def test_targetarch_decides_the_architecture():
    texts = {p.name: p.read_text() for p in [DOCKERFILE, *(ROOT / "docker" / "scripts").glob("*.sh")]}
    assert {name: uname_uses(t) for name, t in texts.items() if uname_uses(t)} == {}
    assert uname_uses(old("docker/Dockerfile"))
    # every stage that picks an arch-specific file or index declares TARGETARCH
    _, stages = parse(DOCKERFILE.read_text())
    for stage in stages:
        text = " ".join(s.text for s in stage.steps)
        if "ROLLOUT8_ARCH" in text or "install-torch.sh" in text and "RUN" in [s.keyword for s in stage.steps]:
            assert "TARGETARCH" in [s.text.split("=")[0] for s in stage.steps if s.keyword == "ARG"], stage.name


def labels(text: str) -> set[str]:
    return {m for _, kw, rest in instructions(text) if kw == "LABEL" for m in re.findall(r"([\w.-]+)=", rest)}


def test_oci_labels_say_which_bundle():
    wanted = {f"org.opencontainers.image.{k}" for k in ("version", "revision", "source", "created")}
    assert wanted <= labels(DOCKERFILE.read_text())
    assert not wanted <= labels(old("docker/Dockerfile"))
