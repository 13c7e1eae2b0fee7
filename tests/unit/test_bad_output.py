"""Bad output never costs data, and a failed write says which path and why.

Every case runs the real CLI (`rollout8.cli.main`) on a fresh copy of one workspace (the tiny model pair, its profile,
data, a valid run spec, a copy of the version lock, a run's logs). The filesystems are real: a tmpfs filled to the
last block (writes fail with ENOSPC) and a read-only tmpfs (EROFS), mounted for the test; that needs root (CI runs
as root), and without it a read-only directory (chmod 0555: EACCES) stands in, while the full filesystem is skipped
with the reason. Each case must: exit non-zero; print one `rollout8 CMD: error: cannot write PATH: CAUSE` line naming
the output and the cause, never "a bug in rollout8" and never an input; change no input; leave nothing behind.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from workspace import make_workspace

from rollout8.cli import describe, main
from rollout8.errors import WriteError
from rollout8.fileutil import atomic_write, staged_dir
from rollout8.paths import lock_path

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def pristine(model_pair, tmp_path_factory) -> Path:
    """bf16/, int8/, profile.pt, data/, spec.yaml (`rollout8 check` passes it), versions.lock.yaml, run/train.log."""
    spec = {
        "name": "t",
        "model": {"bf16": "bf16", "int8": "int8", "profile": "profile.pt"},
        "rollout": {"quantization": "int8"},
        "cluster": {"nnodes": 1, "npus_per_node": 2, "accelerator": "cpu"},
        "data": {"train": "data/train.parquet", "val": "data/val.parquet"},
        "verl": {"data.train_batch_size": 4, "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2, "actor_rollout_ref.rollout.n": 2},
    }
    root = make_workspace(tmp_path_factory.mktemp("pristine-out"), model_pair, spec, real_data=True)
    shutil.copy(lock_path(), root / "versions.lock.yaml")
    (root / "run").mkdir()
    (root / "run" / "train.log").write_text("".join(f"step:{i} - critic/score/mean:0.{i} - timing_s/step:1.{i}\n"
                                                    for i in range(1, 5)))
    return root


@pytest.fixture
def w(pristine, tmp_path, monkeypatch) -> Path:
    """A fresh copy of the workspace; its versions.lock.yaml is the bundle's lock (ROLLOUT8_HOME)."""
    work = tmp_path / "w"
    shutil.copytree(pristine, work)
    monkeypatch.setenv("ROLLOUT8_HOME", str(work))
    assert lock_path() == work / "versions.lock.yaml"
    return work


def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def run_refused(argv: list[str], capsys) -> str:
    """Run `rollout8 ARGV`: refused in exactly one error line, no traceback; returns that line."""
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith(f"rollout8 {argv[0]}: error:")]
    assert rc != 0, (out, err)
    assert "Traceback" not in out + err, err
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------ real filesystems that refuse writes
def mount_tmpfs(where: Path, *options: str) -> str | None:
    """Mount a 256 KiB tmpfs at where; None, or why it cannot be done here."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (CI runs as root)"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=256k", *options)), "rollout8-test",
                           str(where)], capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount -t tmpfs failed: {done.stderr.strip() or done.returncode}"


@pytest.fixture
def full(tmp_path):
    """A real filesystem with no space left: a tmpfs filled to its last block by `filler`."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if why := mount_tmpfs(mnt):
        pytest.skip(f"no full filesystem to write to: {why}")
    try:
        with open(mnt / "filler", "wb", buffering=0) as filler:
            with pytest.raises(OSError) as raised:
                while True:
                    filler.write(b"\0" * 4096)
        assert raised.value.errno == errno.ENOSPC
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def read_only(tmp_path):
    """(a directory no write succeeds in, the cause the message must give): a read-only tmpfs as root, else a
    chmod 0555 directory (root ignores that mode, so root needs the mount)."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if os.geteuid() != 0:
        mnt.chmod(0o555)
        yield mnt, "permission denied"
        mnt.chmod(0o755)
        return
    if why := mount_tmpfs(mnt, "ro"):
        pytest.skip(f"no read-only filesystem to write to: {why}")
    try:
        yield mnt, "read-only file system"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


PROFILE = ["profile", "-m", "{w}/bf16", "-q", "{w}/int8", "--quiet", "-o"]
VERIFY = ["verify-quant", "-m", "{w}/bf16", "-q", "{w}/int8", "-p", "{w}/profile.pt", "--json"]
WRITES = {  # command -> (argv, its output under {out}); every command that writes
    "profile": ([*PROFILE, "{out}/p.pt"], "{out}/p.pt"),
    "convert": (["convert", "--to", "ascend", "{w}/int8", "{out}/ascend"], "{out}/ascend"),
    "plan": (["plan", "{w}/spec.yaml", "-o", "{out}/plan"], "{out}/plan"),
    "report": (["report", "{w}/run", "--mode", "int8", "-o", "{out}/report"], "{out}/report"),
    "render": (["render", "{w}/spec.yaml", "-o", "{out}/rendered"], "{out}/rendered"),
    "setup": (["setup", "--spec", "{w}/spec.yaml", "-o", "{out}/flashrl.yaml"], "{out}/flashrl.yaml"),
    "setup-nested": (["setup", "--spec", "{w}/spec.yaml", "-o", "{out}/new/flashrl.yaml"], "{out}/new/flashrl.yaml"),
    "verify-quant": ([*VERIFY, "{out}/verify.json"], "{out}/verify.json"),
    "make-test-data": (["make-test-data", "-o", "{out}/data"], "{out}/data"),
    "make-test-model": (["make-test-model", "-o", "{out}/models"], "{out}/models"),
}


def refused_write(case: str, w: Path, out: Path, capsys) -> str:
    """Run the case writing under out: one line naming the output; no input changed; nothing new under out."""
    argv, output = WRITES[case]
    before, there = snapshot(w), sorted(p.name for p in out.iterdir())
    line = run_refused([a.replace("{w}", str(w)).replace("{out}", str(out)) for a in argv], capsys)
    assert f"cannot write {output.replace('{out}', str(out))}" in line, line
    assert "a bug in rollout8" not in line and "input" not in line, line
    assert snapshot(w) == before, "an input was changed or something was left behind"
    assert sorted(p.name for p in out.iterdir()) == there, "a partial output was left behind"
    return line


@pytest.mark.parametrize("case", list(WRITES))
def test_a_full_disk_is_named_with_the_output_path(case, w, full, capsys):
    line = refused_write(case, w, full, capsys)
    assert "no space left on device" in line, line


@pytest.mark.parametrize("case", ["profile", "convert", "plan", "report", "setup-nested", "verify-quant"])
def test_a_read_only_target_is_named_with_the_output_path(case, w, read_only, capsys):
    out, cause = read_only
    line = refused_write(case, w, out, capsys)
    assert cause in line, line


def test_the_write_itself_failing_on_a_read_only_filesystem_names_the_file(read_only):
    """Past the early check (the filesystem turned read-only meanwhile): the atomic write names its target."""
    out, cause = read_only
    with pytest.raises(WriteError, match=f"cannot write {out / 'a' / 'f.txt'}: {cause}"):
        atomic_write(out / "a" / "f.txt", "text")
    with pytest.raises(WriteError, match=f"cannot write {out / 'model'}: {cause}"), staged_dir(out / "model") as tmp:
        (tmp / "x").write_text("x")
    assert list(out.iterdir()) == []


def test_a_library_that_fails_a_write_without_an_errno_is_judged_on_the_filesystem(full):
    """torch.save reports a full disk as a RuntimeError with no errno: the filesystem it filled says why."""
    def torch_like(tmp: Path) -> None:
        with open(tmp, "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\1" * 4096)
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from None

    with pytest.raises(WriteError, match=f"cannot write {full / 'p.pt'}: no space left on device"):
        atomic_write(full / "p.pt", torch_like)
    assert sorted(p.name for p in full.iterdir()) == ["filler"]


def test_an_unmapped_library_write_error_is_never_blamed_on_an_input():
    class SafetensorError(Exception):
        pass

    text = describe(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert "no space left on device" in text and "input" not in text and "bug" not in text, text


# ------------------------------------------------------------------ the version lock is an input too
@pytest.mark.parametrize("command", ["plan", "render"])
@pytest.mark.parametrize("where", ["{w}/versions.lock.yaml", "{w}/versions.lock.yaml/out"])
def test_no_output_onto_or_inside_the_lock(command, where, w, capsys):
    before = snapshot(w)
    line = run_refused([command, str(w / "spec.yaml"), "-o", where.replace("{w}", str(w))], capsys)
    assert f"the input lock ({w / 'versions.lock.yaml'})" in line, line
    assert snapshot(w) == before


def test_a_failed_plan_leaves_no_directory_it_created(w, capsys):
    """A plan refused after its output directory was made (an artifact missing): the new directories are gone."""
    (w / "data" / "val.parquet").unlink()
    before = snapshot(w)
    run_refused(["plan", str(w / "spec.yaml"), "--no-check", "-o", str(w / "new" / "plan")], capsys)
    assert snapshot(w) == before
