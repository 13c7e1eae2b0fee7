"""`rollout8 doctor`: each check fails on the bad state and passes on the good one; fixed exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rollout8.node import doctor


def test_auto_patch_detected_and_cleanup_form_accepted(tmp_path, monkeypatch):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    monkeypatch.setattr(doctor.site, "getsitepackages", lambda: [str(site_dir)])
    monkeypatch.setattr(doctor.site, "getusersitepackages", lambda: str(tmp_path / "user"))
    assert doctor.check_flashrl_auto_patch().status == doctor.OK

    # What `flashrl setup` writes, and what `flashrl cleanup` leaves behind.
    (site_dir / "usercustomize.py").write_text("try: import flash_rl\nexcept ImportError: pass\n")
    result = doctor.check_flashrl_auto_patch()
    assert result.status == doctor.FAIL and "flashrl cleanup" in result.fix
    (site_dir / "usercustomize.py").write_text("# try: import flash_rl\n# except ImportError: pass\n")
    assert doctor.check_flashrl_auto_patch().status == doctor.OK


def test_flashrl_config_must_be_absolute_and_present(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHRL_CONFIG", "configs/flashrl.yaml")
    assert doctor.check_flashrl_config().status == doctor.FAIL
    monkeypatch.setenv("FLASHRL_CONFIG", str(tmp_path / "missing.yaml"))
    result = doctor.check_flashrl_config()
    assert result.status == doctor.FAIL and "does not exist" in result.detail
    (tmp_path / "flashrl.yaml").write_text("configs: []\n")
    monkeypatch.setenv("FLASHRL_CONFIG", str(tmp_path / "flashrl.yaml"))
    assert doctor.check_flashrl_config().status == doctor.OK
    monkeypatch.delenv("FLASHRL_CONFIG")
    assert doctor.check_flashrl_config().status == doctor.WARN


def test_version_mismatch_fails_on_npu_and_warns_on_cpu():
    # The test environment's torch is the CPU build, never the image's pinned version.
    pins = {"torch": "0.0.1", "torch_npu": "0.0.1"}
    npu = {r.check: r.status for r in doctor.check_versions(pins, "npu")}
    cpu = {r.check: r.status for r in doctor.check_versions(pins, "cpu")}
    assert npu["version:torch"] == doctor.FAIL
    assert cpu["version:torch"] == doctor.WARN
    assert npu["version:torch_npu"] == doctor.FAIL  # not installed here: fatal on an NPU node
    assert cpu["version:torch_npu"] == doctor.SKIP


def test_disk_bound(tmp_path):
    assert doctor.check_disk(tmp_path / "not" / "yet", 0.001).status == doctor.OK
    assert doctor.check_disk(tmp_path, 10**9).status == doctor.FAIL


def test_npu_check_fails_plainly_without_npu_smi(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    result = doctor.check_npus(8)
    assert result.status == doctor.FAIL and "npu-smi" in result.detail


def _doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "FLASHRL_CONFIG"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "rollout8", "doctor", *args], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_cli_json_report_and_exit_codes(tmp_path):
    # ray belongs on cluster nodes, not necessarily in the test environment: the escape hatch is explicit.
    ok = _doctor("--accelerator", "cpu", "--root", str(tmp_path), "--min-disk-gib", "0.001",
                 "--min-shm-gib", "0", "--skip", "version:ray", "--json")
    report = json.loads(ok.stdout)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert report["ok"] is True
    checks = {r["check"]: r["status"] for r in report["results"]}
    assert checks["npu-smi"] == "skip"
    assert checks["version:ray"] == "skip"

    typo = _doctor("--accelerator", "cpu", "--skip", "version:rey")
    assert typo.returncode == 2 and "no such check" in typo.stderr

    bad = _doctor("--accelerator", "cpu", "--root", str(tmp_path), "--min-disk-gib", "0.001",
                  "--min-shm-gib", "0", "--skip", "version:ray", env={"FLASHRL_CONFIG": "relative.yaml"})
    assert bad.returncode == 1
    assert "FLASHRL_CONFIG" in bad.stdout and "absolute" in bad.stdout and "1 failure" in bad.stdout


def test_npu_node_without_npu_fails(tmp_path):
    res = _doctor("--accelerator", "npu", "--root", str(tmp_path), "--min-disk-gib", "0.001", "--min-shm-gib", "0")
    assert res.returncode == 1
    assert Path("/dev/davinci0").exists() or "npu-smi" in res.stdout
