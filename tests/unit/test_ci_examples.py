"""The users' container CI: ci-examples/ (GitLab CI, GitHub Actions with self-hosted Ascend runners).

Each sample is checked against its published schema (check-jsonschema's vendored gitlab-ci / github-workflows
schemas) and the workflow with actionlint, as `make ci-examples-check` (part of `make lint`) does; a broken copy
must be refused by the same check. Then what a pipeline must do: build with `make image` and the previous build's
cache, `make smoke`, `make image-save` kept as an artifact, `make accept-npu` on the NPU runner, the CANN installers
from a protected location.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GITLAB = ROOT / "ci-examples" / "gitlab" / ".gitlab-ci.yml"
GITHUB = ROOT / "ci-examples" / "github" / ".github" / "workflows" / "rollout8-image.yml"
ACTIONLINT_CONFIG = ROOT / "ci-examples" / "github" / ".github" / "actionlint.yaml"


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    if not path:
        pytest.skip(f"{name} not installed (pip install -e '.[lint]')")
    return str(path)


def schema_check(schema: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("check-jsonschema"), "--builtin-schema", schema, str(path)], capture_output=True,
                          text=True, timeout=120)


def actionlint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("actionlint"), "-config-file", str(ACTIONLINT_CONFIG), "-shellcheck=", "-pyflakes=",
                           str(path)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("schema", "path"), [("vendor.gitlab-ci", GITLAB), ("vendor.github-workflows", GITHUB)])
def test_sample_passes_its_published_schema(schema, path):
    result = schema_check(schema, path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflow_passes_actionlint():
    result = actionlint(GITHUB)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_checks_refuse_a_broken_sample(tmp_path):
    bad_gitlab = tmp_path / ".gitlab-ci.yml"
    data = yaml.safe_load(GITLAB.read_text())
    data["smoke"]["needs"] = "build"  # a string where the schema wants a list
    data["smoke"]["when"] = "sometimes"
    bad_gitlab.write_text(yaml.safe_dump(data))
    assert schema_check("vendor.gitlab-ci", bad_gitlab).returncode != 0
    bad_github = tmp_path / "workflow.yml"
    bad_github.write_text(GITHUB.read_text().replace("needs: smoke", "needs: smoek"))
    assert actionlint(bad_github).returncode != 0  # a job that does not exist


def scripts_of(data: dict, key: str) -> dict[str, str]:
    out = {}
    for name, job in data.items():
        if isinstance(job, dict) and key in job:
            steps = job[key]
            out[name] = "\n".join(s if isinstance(s, str) else str(s.get("run", "")) for s in steps)
    return out


def test_gitlab_pipeline_does_the_four_steps():
    data = yaml.safe_load(GITLAB.read_text())
    scripts = scripts_of(data, "script")
    assert "make image" in scripts["build"] and "CACHE_FROM=" in scripts["build"]
    assert "$CANN_INSTALLERS_DIR" in scripts["build"] and data["build"]["rules"][0]["if"].startswith(
        "$CI_COMMIT_REF_PROTECTED")
    assert "make smoke" in scripts["smoke"]
    assert "make image-save" in scripts["image-save"]
    assert any(p.endswith(".tar.gz") for p in data["image-save"]["artifacts"]["paths"])
    assert "make accept-npu" in scripts["accept-npu"] and data["accept-npu"]["tags"] == ["ascend-npu"]


def test_github_workflow_does_the_four_steps():
    jobs = yaml.safe_load(GITHUB.read_text())["jobs"]
    runs = {name: "\n".join(str(s.get("run", "")) + str(s.get("uses", "")) for s in job["steps"])
            for name, job in jobs.items()}
    assert "make image" in runs["build"] and "CACHE_FROM=" in runs["build"]
    assert "secrets.CANN_INSTALLERS_DIR" in GITHUB.read_text() and jobs["build"]["environment"] == "ascend"
    assert "make smoke" in runs["smoke"]
    assert "make image-save" in runs["image-save"] and "actions/upload-artifact" in runs["image-save"]
    assert "make accept-npu" in runs["accept-npu"] and "ascend-npu" in jobs["accept-npu"]["runs-on"]
