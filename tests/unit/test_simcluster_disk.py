"""The simulated cluster's disk guards: a step that needs GBs refuses up front in one line (CI once died with
ENOSPC inside `docker save` and pip), and the wheelhouse keeps only the current key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import simcluster  # virtual/, on pytest's pythonpath

REPO = Path(__file__).resolve().parents[2]


def test_need_disk_refuses_in_one_line_naming_path_and_sizes(tmp_path):
    with pytest.raises(SystemExit) as err:
        simcluster.need_disk(str(tmp_path), 10**6, "building rollout8/sim-stack:x")
    msg = str(err.value)
    assert "\n" not in msg
    assert "building rollout8/sim-stack:x needs about 1000000 GB free under" in msg and str(tmp_path) in msg
    simcluster.need_disk(str(tmp_path), 0, "nothing")  # enough: returns


def test_wheelhouse_script_removes_superseded_keys(tmp_path):
    out = tmp_path / "wh"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(out), "PY": sys.executable}
    key = subprocess.run(["bash", "scripts/build-wheelhouse.sh", "--key"], cwd=REPO, capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout.strip()
    assert len(key) == 12 and not out.joinpath(key).exists()  # --key builds nothing
    (out / key).mkdir(parents=True)
    (out / key / ".complete").touch()  # the current key, complete: nothing is downloaded
    stale = out / "0123456789ab"
    stale.mkdir()
    (stale / "torch-0-py3-none-any.whl").write_bytes(b"x")
    run = subprocess.run(["bash", "scripts/build-wheelhouse.sh"], cwd=REPO, capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1].endswith(key)
    assert not stale.exists() and (out / key / ".complete").exists() and (out / "bundle").is_dir()


def test_load_throttle_counts_the_tarballs_staged_on_the_shared_disk(tmp_path, monkeypatch):
    """Three nodes on one disk: loads at once are what fits beside the staged tarballs (a spec without a shared
    directory stages one per node), and none fitting is refused in one line instead of three failed loads."""
    import sim_demo

    tarball = tmp_path / "train.tar"
    with tarball.open("wb") as handle:
        handle.truncate(7 * 10**9)  # sparse: its size is what counts
    monkeypatch.setattr(sim_demo, "free_gb", lambda path: 52.0)
    assert sim_demo.load_throttle(tarball, 3) == 3  # one copy on the shared directory: 50 GB fit three loads
    assert sim_demo.load_throttle(tarball, 3, staged=3) == 2  # 21 GB staged: 29 GB fit two
    monkeypatch.setattr(sim_demo, "free_gb", lambda path: 30.0)
    with pytest.raises(SystemExit) as err:
        sim_demo.load_throttle(tarball, 3, staged=3)
    msg = str(err.value)
    assert "\n" not in msg and "3 staged copies of train.tar (7.0 GB each)" in msg and "only 30.0 GB are" in msg
