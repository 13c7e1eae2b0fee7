"""The build guards of docker/Dockerfile, run for real outside a build (bash, git, pip metadata).

- install-cann.sh: a CANN installer is run only if its sha256 equals the lock's; an empty slot is refused unless
  ALLOW_UNVERIFIED_CANN=1; a missing file points at docker/cann/README.md;
- fetch-source.sh: a source is checked out at the pinned commit and `git rev-parse HEAD` proves it;
- pin-guard.sh: an installed distribution that moved away from its pin fails the step;
- strip-torch-pins.py: vllm-ascend's torch / torch-npu requirement lines go, nothing else does.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollout8.lock import load_lock

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "docker" / "scripts"


def run(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full_env, cwd=cwd)


# ------------------------------------------------------------------------------------------ install-cann.sh

def fake_installer(path: Path, log: Path, kind: str, ascend_home: Path) -> None:
    """A stand-in .run: records how it was called; the toolkit one writes set_env.sh as the real one does."""
    body = f'echo "{kind} $*" >> {log}\n'
    if kind == "TOOLKIT":
        toolkit = ascend_home / "ascend-toolkit"
        body += f"mkdir -p {toolkit} && echo 'export TOOLKIT_ENV=1' > {toolkit}/set_env.sh\n"
    if kind == "NNAL":
        body += '[ "${TOOLKIT_ENV:-}" = 1 ] || { echo "nnal without the toolkit env" >&2; exit 3; }\n'
    path.write_text("#!/bin/bash\n" + body)


@pytest.fixture
def cann(tmp_path):
    lock = load_lock()
    folder, home, log = tmp_path / "cann", tmp_path / "Ascend", tmp_path / "calls.log"
    folder.mkdir()
    env = {k: v for k, v in lock.build_args().items() if k.startswith("CANN_")}
    env.update(TARGETARCH="amd64", ASCEND_HOME=str(home))
    for kind in ("TOOLKIT", "KERNELS", "NNAL"):
        file = folder / env[f"CANN_{kind}_X86_64_FILE"]
        fake_installer(file, log, kind, home)
        env[f"CANN_{kind}_X86_64_SHA256"] = hashlib.sha256(file.read_bytes()).hexdigest()
    return folder, env, log


def install(folder: Path, env: dict) -> subprocess.CompletedProcess:
    return run(["bash", str(SCRIPTS / "install-cann.sh"), str(folder)], env=env)


def test_cann_verified_installers_run_in_order(cann):
    folder, env, log = cann
    result = install(folder, env)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["TOOLKIT", "KERNELS", "NNAL"]
    assert all("--install" in c and "--quiet" in c for c in calls)


def test_cann_empty_sha256_is_refused(cann):
    folder, env, log = cann
    want = env["CANN_KERNELS_X86_64_SHA256"]
    env["CANN_KERNELS_X86_64_SHA256"] = ""
    result = install(folder, env)
    assert result.returncode != 0
    assert "no sha256" in result.stderr and want in result.stderr and "ALLOW_UNVERIFIED_CANN=1" in result.stderr
    assert "KERNELS" not in log.read_text()  # stopped before running it


def test_cann_empty_sha256_allowed_explicitly_warns(cann):
    folder, env, log = cann
    env["CANN_NNAL_X86_64_SHA256"] = ""
    result = install(folder, {**env, "ALLOW_UNVERIFIED_CANN": "1"})
    assert result.returncode == 0, result.stderr
    assert "NOT verified" in result.stderr
    assert "NNAL" in log.read_text()


def test_cann_wrong_sha256_is_refused(cann):
    folder, env, log = cann
    env["CANN_TOOLKIT_X86_64_SHA256"] = "0" * 64
    result = install(folder, env)
    assert result.returncode != 0 and "wrong or corrupt" in result.stderr
    assert not log.exists()


def test_cann_missing_installer_points_at_the_readme(cann):
    folder, env, _ = cann
    (folder / env["CANN_NNAL_X86_64_FILE"]).unlink()
    result = install(folder, env)
    assert result.returncode != 0
    assert env["CANN_NNAL_X86_64_FILE"] in result.stderr and "docker/cann/README.md" in result.stderr


def test_cann_picks_the_target_architecture(cann):
    folder, env, _ = cann
    result = install(folder, {**env, "TARGETARCH": "arm64"})
    assert result.returncode != 0
    assert env["CANN_TOOLKIT_AARCH64_FILE"] in result.stderr  # the aarch64 file is looked for, and absent


# ------------------------------------------------------------------------------------------ fetch-source.sh

@pytest.fixture
def upstream(tmp_path):
    repo = tmp_path / "upstream"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    assert run(["git", "init", "-q", str(repo)]).returncode == 0
    commits = []
    for i in range(2):
        (repo / "f.txt").write_text(f"v{i}\n")
        run([*git, "add", "f.txt"])
        assert run([*git, "commit", "-q", "-m", f"c{i}"]).returncode == 0
        commits.append(run([*git, "rev-parse", "HEAD"]).stdout.strip())
    return repo, commits


@pytest.mark.parametrize("mode", ["shallow", "full"])
def test_fetch_source_checks_out_and_verifies_the_pin(tmp_path, upstream, mode):
    repo, commits = upstream
    src = tmp_path / "src"
    env = {"SRC_ROOT": str(src), "GIT_ALLOW_PROTOCOL": "file"}
    result = run(["bash", str(SCRIPTS / "fetch-source.sh"), "demo", f"file://{repo}", commits[0], mode], env=env)
    assert result.returncode == 0, result.stderr
    assert f"at {commits[0]} (verified)" in result.stdout
    assert (src / "demo" / "f.txt").read_text() == "v0\n"  # the pinned commit, not the branch head


def test_fetch_source_refuses_a_non_commit(tmp_path, upstream):
    repo, _ = upstream
    result = run(["bash", str(SCRIPTS / "fetch-source.sh"), "demo", f"file://{repo}", "main"],
                 env={"SRC_ROOT": str(tmp_path / "src")})
    assert result.returncode != 0 and "not a full 40-hex commit id" in result.stderr


def test_fetch_source_fails_on_an_unknown_commit(tmp_path, upstream):
    repo, _ = upstream
    result = run(["bash", str(SCRIPTS / "fetch-source.sh"), "demo", f"file://{repo}", "f" * 40],
                 env={"SRC_ROOT": str(tmp_path / "src")})
    assert result.returncode != 0


# ------------------------------------------------------------------------------------------ pin-guard.sh

def test_pin_guard():
    import yaml

    ok = run(["bash", str(SCRIPTS / "pin-guard.sh"), f"pyyaml=={yaml.__version__}"])
    assert ok.returncode == 0, ok.stderr
    moved = run(["bash", str(SCRIPTS / "pin-guard.sh"), f"pyyaml=={yaml.__version__}", "pyyaml==0.0.1"])
    assert moved.returncode != 0 and "pyyaml is" in moved.stderr and "pins 0.0.1" in moved.stderr
    absent = run(["bash", str(SCRIPTS / "pin-guard.sh"), "surely-not-installed-dist==1.0"])
    assert absent.returncode != 0 and "(not installed)" in absent.stderr


# ------------------------------------------------------------------------------------------ strip-torch-pins.py

# The shape of vllm-ascend's files at the pin (written here, not copied): the lines that matter and their neighbours.
PYPROJECT = """[build-system]
requires = [
    "cmake>=3.26",
    "numpy<2.0.0",
    "torch-npu==9.9.9.dev1",
    "torch>=9.9",
    "torchvision",
    "wheel",
]
build-backend = "setuptools.build_meta"
"""
REQUIREMENTS = """cmake>=3.26
torch>=9.9
torchvision
# Install torch_npu
--pre
--extra-index-url https://vendor.example/pypi
torch-npu==9.9.9.dev1
"""


def test_strip_torch_pins(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "requirements.txt").write_text(REQUIREMENTS)
    result = run([sys.executable, str(SCRIPTS / "strip-torch-pins.py"), str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cmake>=3.26", "numpy<2.0.0", "torchvision", "wheel"]
    req = (tmp_path / "requirements.txt").read_text()
    assert "torch>=" not in req and "torch-npu==" not in req and "torchvision" in req and "cmake>=3.26" in req
    assert "torch" not in (tmp_path / "pyproject.toml").read_text().replace("torchvision", "")
    again = run([sys.executable, str(SCRIPTS / "strip-torch-pins.py"), str(tmp_path)])
    assert again.returncode != 0 and "no torch/torch-npu line found" in again.stderr
