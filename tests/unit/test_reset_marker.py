"""reset removes only what rollout8 made: the artifacts role makes a missing deploy root with a marker
(`<deploy root>/.rollout8-deploy-root`, naming the path and the run), and reset removes a deploy root only when it
carries that marker, never `/`, a path with `..`, a top-level or a system directory. Anything else is left in
place and named (node and path) while the rest of the teardown goes on. And `rollout8 plan` leaves no plan behind
when it cannot make one.

The node module (ansible/library/rollout8_deploy_root.py) runs as Ansible runs it, and the real playbooks run
(ansible-playbook from .venv) against one node that is this machine (ansible_connection=local): its deploy root,
rollout8_home and the controller's work directory all lie under tmp_path, so nothing outside it is touched (the
training container is one no machine has, so Ray's stop in it fails, as it may, and its removal has nothing to
remove; without Docker there is no container to remove).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
MODULE = ANSIBLE / "library" / "rollout8_deploy_root.py"
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
MARKER = ".rollout8-deploy-root"


# ---------------------------------------------------------------------------------------------- the node module
def module(tmp_path: Path, **params) -> dict:
    args = tmp_path / "module-args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
    proc = subprocess.run([sys.executable, str(MODULE), str(args)], capture_output=True, text=True, timeout=60)
    out = json.loads(proc.stdout)
    assert (proc.returncode != 0) == bool(out.get("failed")), out
    return out


def rules():
    """The module's own path rules, imported from its file (it runs on the node, outside the package)."""
    spec = importlib.util.spec_from_file_location("rollout8_deploy_root", MODULE)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def test_present_makes_a_missing_root_with_its_marker_and_a_rerun_changes_nothing(tmp_path):
    root = tmp_path / "runs" / "demo"
    out = module(tmp_path, path=str(root), run="demo", mode="0750", state="present")
    assert (out["changed"], out["created"], out["marked"]) == (True, True, True), out
    note = json.loads((root / MARKER).read_text())
    assert note["created_by"] == "rollout8" and note["path"] == str(root) and note["run"] == "demo"
    assert oct(root.stat().st_mode & 0o777) == "0o750"
    assert sorted(p.name for p in root.iterdir()) == [MARKER]
    assert [p.name for p in root.parent.iterdir()] == ["demo"], "the temporary directory was left behind"
    before = (root / MARKER).stat().st_mtime_ns
    again = module(tmp_path, path=str(root), run="demo", state="present")
    assert (again["changed"], again["created"], again["marked"]) == (False, False, True), again
    assert (root / MARKER).stat().st_mtime_ns == before


def test_present_leaves_a_directory_that_was_there_unmarked_and_says_reset_will_not_remove_it(tmp_path):
    root = tmp_path / "mine"
    root.mkdir()
    (root / "keep.txt").write_text("the user's\n")
    out = module(tmp_path, path=str(root), run="demo", state="present")
    assert (out["changed"], out["created"], out["marked"]) == (False, False, False), out
    assert f"{root} was there before rollout8" in out["msg"] and "reset never removes it" in out["msg"]
    assert not (root / MARKER).exists()


@pytest.mark.parametrize("path,why", [
    ("/", "is / (the whole filesystem)"),
    ("/usr", "is a system directory"),
    ("/var/lib", "is a system directory"),
    ("/data", "is a system directory"),
    ("/opt/rollout8/../../usr", "has a .. (or .) segment"),
    ("runs/demo", "is not an absolute path"),
])
def test_present_refuses_a_path_no_deploy_root_may_be(tmp_path, path, why):
    out = module(tmp_path, path=path, run="demo", state="present")
    assert out.get("failed") and f"deploy root {path} {why}: refused, nothing was sent" in out["msg"], out


def test_present_refuses_a_path_that_leads_into_a_system_directory_through_a_link(tmp_path):
    (tmp_path / "link").symlink_to("/")
    out = module(tmp_path, path=f"{tmp_path}/link/etc", run="demo", state="present")
    assert out.get("failed") and "leads to /etc, which is a system directory" in out["msg"], out


@pytest.mark.parametrize("path,why", [
    ("/", "is / (the whole filesystem)"),
    ("/usr", "is a system directory"),
    ("/etc", "is a system directory"),
    ("/home", "is a system directory"),
    ("/tmp", "is a system directory"),
    ("/data", "is a system directory"),
    ("/var/lib", "is a system directory"),
    ("/usr/local", "is a system directory"),
    ("/home/alice", "is a system directory"),
    ("/rollout8-run", "is a top-level directory"),
    ("/var/lib/rollout8/../../../etc", "has a .. (or .) segment"),
    ("/var/lib/rollout8/runs/./demo", "has a .. (or .) segment"),
    ("//var/lib/rollout8/runs/demo", "has an empty segment (// or a trailing /)"),
])
def test_reset_never_removes_slash_dotdot_a_top_level_or_a_system_directory_even_with_a_marker(path, why):
    """The path rules come before the marker: a marker there would not make these removable."""
    assert rules().path_problem(path, removing=True) == why


def test_paths_a_deploy_root_may_be(tmp_path):
    ok = rules()
    for path in ("/var/lib/rollout8/runs/demo", "/opt/runs", "/srv/rollout8", "/data/runs", "/mnt/nvme/run",
                 str(tmp_path / "deploy")):
        assert ok.path_problem(path, removing=True) == "", path
    # a top-level directory of its own may be made (and is then filled), but reset never removes it
    assert ok.path_problem("/rollout8-run", removing=False) == ""


def mark(root: Path, named: str | None = None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text(rules().marker_text(named or str(root), "demo"))


def test_absent_removes_a_marked_root_and_then_finds_it_gone(tmp_path):
    root = tmp_path / "deploy"
    module(tmp_path, path=str(root), run="demo", state="present")
    (root / "models").mkdir()
    (root / "models" / "w.bin").write_bytes(b"\0" * 64)
    (root / "outside").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_text("not in the deploy root\n")
    out = module(tmp_path, path=str(root), state="absent")
    assert (out["changed"], out["removed"], out["refused"]) == (True, True, ""), out
    assert not root.exists()
    assert (tmp_path / "elsewhere" / "keep.txt").exists(), "a link inside the deploy root was followed"
    again = module(tmp_path, path=str(root), state="absent")
    assert (again["changed"], again["removed"], again["refused"]) == (False, False, ""), again


@pytest.mark.parametrize("case,why", [
    ("no marker", f"has no {MARKER} (rollout8 did not make it)"),
    ("marker naming another path", f"has a {MARKER} naming another directory"),
    ("marker not rollout8's", f"has a {MARKER} that does not say rollout8 made it"),
    ("marker is a link", f"has a {MARKER} that is not the small file rollout8 writes"),
    ("root is a link", "is a symbolic link"),
    ("dotdot", "has a .. (or .) segment"),
])
def test_absent_leaves_a_directory_rollout8_did_not_make_untouched_and_says_why(tmp_path, case, why):
    root, path = tmp_path / "deploy", str(tmp_path / "deploy")
    root.mkdir()
    (root / "keep.txt").write_text("the user's\n")
    if case == "marker naming another path":
        mark(root, named=str(tmp_path / "other"))
    elif case == "marker not rollout8's":
        (root / MARKER).write_text(json.dumps({"created_by": "someone", "path": str(root)}))
    elif case == "marker is a link":
        mark(tmp_path / "real")
        (root / MARKER).symlink_to(tmp_path / "real" / MARKER)
    elif case == "root is a link":
        mark(tmp_path / "real")
        path = str(tmp_path / "link")
        (tmp_path / "link").symlink_to(tmp_path / "real")
    elif case == "dotdot":
        mark(root)
        path = f"{tmp_path}/x/../deploy"
    out = module(tmp_path, path=path, state="absent")
    assert (out["changed"], out["removed"]) == (False, False) and not out.get("failed"), out
    assert out["refused"].startswith(why), out
    assert out["msg"].startswith(f"left {path} in place: it {why}"), out
    assert (root / "keep.txt").read_text() == "the user's\n"
    if case in ("marker is a link", "root is a link"):
        assert (tmp_path / "real" / MARKER).is_file()


# ---------------------------------------------------------------------------------------------- the playbooks
needs_ansible = pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook is not in this venv (make venv)")

INVENTORY = f"""[head]
node-a ansible_connection=local ansible_become=false ansible_python_interpreter={sys.executable}
[workers]
[cluster:children]
head
workers
"""


def playbook(tmp_path: Path, name: str, *args: str) -> tuple[int, str]:
    """`name` against the one local node; rollout8_home and the work directory under tmp_path."""
    inv = tmp_path / "inventory" / "hosts.ini"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(INVENTORY)
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), ANSIBLE_NOCOLOR="1",
               PATH=f"{PLAYBOOK.parent}:{os.environ['PATH']}")
    proc = subprocess.run([str(PLAYBOOK), "-i", str(inv), name, "-e", f"rollout8_run_spec={tmp_path}/run.yaml",
                           "-e", f"rollout8_work_dir={tmp_path}/work", "-e", f"rollout8_home={tmp_path}/home",
                           "-e", "rollout8_container_name=rollout8-unit-reset-absent",
                           # a cpu spec: the probe job (a cpu verl job needs the simulated cluster's stand-in image)
                           "-e", "rollout8_job_kind=probe", *args],
                          cwd=ANSIBLE, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


RESET = ("-e", "rollout8_reset_confirmed=true", "-e", "rollout8_reset_remove_artifacts=true")


def reset(tmp_path: Path, deploy_root: str | None = None) -> tuple[int, str]:
    """reset.yml removing artifacts; with deploy_root, the plan on the controller names it (as train.yml left it)."""
    if deploy_root is not None:
        plan_dir = tmp_path / "work" / "run"
        plan_dir.mkdir(parents=True, exist_ok=True)
        (plan_dir / "rollout8-plan.json").write_text(json.dumps({"name": "demo", "deploy_root": deploy_root}))
    (tmp_path / "home" / "run").mkdir(parents=True, exist_ok=True)  # the job state reset always removes
    return playbook(tmp_path, "reset.yml", *RESET)


def recap(out: str) -> dict[str, int]:
    tail = out.rsplit("PLAY RECAP", 1)[-1]
    fields = tail.split("node-a :", 1)[1].split()[:7]
    return {k: int(v) for k, v in (f.split("=") for f in fields)}


@needs_ansible
def test_reset_leaves_a_marker_less_deploy_root_names_it_and_tears_down_the_rest(tmp_path):
    """The issue's case: a directory rollout8 did not make survives reset with artifact removal, every time."""
    root = tmp_path / "deploy"
    (root / "models").mkdir(parents=True)
    (root / "models" / "w.bin").write_bytes(b"weights")
    for _ in range(2):
        rc, out = reset(tmp_path, str(root))
        assert rc == 0, out[-3000:]
        assert f"node-a: left {root} in place: it has no {MARKER} (rollout8 did not make it)" in out, out[-3000:]
        assert f"deploy root {root}: LEFT IN PLACE on node-a" in out, out[-3000:]
        assert (root / "models" / "w.bin").read_bytes() == b"weights"
        assert not (tmp_path / "home" / "run").exists(), "the rest of the teardown did not run"
        assert recap(out)["failed"] == 0


@needs_ansible
def test_reset_removes_a_marked_deploy_root_and_a_second_reset_changes_nothing(tmp_path):
    root = tmp_path / "deploy"
    module(tmp_path, path=str(root), run="demo", state="present")  # what the artifacts role does on the node
    (root / "data").mkdir()
    (root / "data" / "train.parquet").write_bytes(b"PAR1")
    rc, out = reset(tmp_path, str(root))
    assert rc == 0, out[-3000:]
    assert not root.exists() and tmp_path.exists()
    assert f"deploy root {root}: removed on node-a" in out and "LEFT IN PLACE" not in out, out[-3000:]
    assert recap(out)["changed"] >= 1
    rc, out = playbook(tmp_path, "reset.yml", *RESET)  # the job state already gone too
    assert rc == 0, out[-3000:]
    assert f"deploy root {root}: not there on node-a" in out, out[-3000:]
    assert recap(out)["changed"] == 0, out[-3000:]


@needs_ansible
def test_reset_refuses_a_marked_deploy_root_written_with_dotdot(tmp_path):
    root = tmp_path / "deploy"
    module(tmp_path, path=str(root), run="demo", state="present")
    (tmp_path / "x").mkdir()
    rc, out = reset(tmp_path, f"{tmp_path}/x/../deploy")
    assert rc == 0, out[-3000:]
    assert f"node-a: left {tmp_path}/x/../deploy in place: it has a .. (or .) segment" in out, out[-3000:]
    assert (root / MARKER).is_file()


# ---------------------------------------------------------------------------------------------- train.yml, then reset
@pytest.fixture
def run_spec(tmp_path, model_pair):
    """configs/runs/tiny-cpu.yaml for one node, its deploy root under tmp_path (a real pair, profile and data)."""
    pytest.importorskip("torch")
    from workspace import shipped_tiny_spec

    spec = shipped_tiny_spec(tmp_path, model_pair)
    spec["cluster"]["nnodes"] = 1
    spec["cluster"].pop("network", None)  # one node: this machine, whose interfaces have other names
    spec["deploy"]["root"] = str(tmp_path / "node" / "runs" / "tiny-cpu")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    return Path(spec["deploy"]["root"])


@needs_ansible
def test_the_artifacts_role_marks_the_root_it_makes_and_reset_removes_it(tmp_path, run_spec):
    root = run_spec
    rc, out = playbook(tmp_path, "train.yml", "--tags", "artifacts")
    assert rc == 0, out[-3000:]
    note = json.loads((root / MARKER).read_text())
    assert (note["created_by"], note["path"], note["run"]) == ("rollout8", str(root), "tiny-cpu")
    assert (root / "rollout8-plan.json").is_file() and (root / "models" / "int8").is_dir()
    rc, out = playbook(tmp_path, "train.yml", "--tags", "artifacts")  # nothing to make, mark or send again
    assert rc == 0 and recap(out)["changed"] == 0, out[-3000:]
    assert "was there before rollout8" not in out

    rc, out = playbook(tmp_path, "reset.yml", *RESET)
    assert rc == 0 and f"deploy root {root}: removed on node-a" in out, out[-3000:]
    assert not root.exists() and root.parent.is_dir()  # the deploy root only, not the directory above it
    rc, out = playbook(tmp_path, "reset.yml", *RESET)
    assert rc == 0 and recap(out)["changed"] == 0 and f"deploy root {root}: not there on node-a" in out


@needs_ansible
def test_the_artifacts_role_fills_a_directory_that_was_there_without_marking_it(tmp_path, run_spec):
    root = run_spec
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("the user's\n")
    rc, out = playbook(tmp_path, "train.yml", "--tags", "artifacts")
    assert rc == 0, out[-3000:]
    assert f"node-a: {root} was there before rollout8 (it has no {MARKER}" in out, out[-3000:]
    assert (root / "rollout8-plan.json").is_file() and not (root / MARKER).exists()
    rc, out = playbook(tmp_path, "reset.yml", *RESET)
    assert rc == 0 and f"node-a: left {root} in place" in out, out[-3000:]
    assert (root / "notes.txt").read_text() == "the user's\n" and (root / "rollout8-plan.json").is_file()


# ---------------------------------------------------------------------------------------------- rollout8 plan
def test_plan_that_cannot_be_made_leaves_no_plan_behind(tmp_path, run_spec, capsys):
    """`/` as the deploy root failed inside the plan step with an internal error after writing rollout8-plan.json
    (and the FlashRL YAML and launch.sh); a plan that cannot be made now writes none of them, and says why in one
    line. (The run spec refuses `/` itself as well, before the plan is computed.)"""
    from rollout8.cli import main

    spec = yaml.safe_load((tmp_path / "run.yaml").read_text())
    spec["deploy"]["root"] = "/"
    (tmp_path / "root.yaml").write_text(yaml.safe_dump(spec))
    out_dir = tmp_path / "plan"
    for extra in ([], ["--no-check"]):  # as the plan role runs it, and without check's rules
        assert main(["plan", str(tmp_path / "root.yaml"), "-o", str(out_dir), *extra]) != 0
        err = capsys.readouterr().err
        assert err.startswith("rollout8 plan: error: ") and "deploy.root" in err, err
        assert "unexpected" not in err and "Traceback" not in err, err
        left = sorted(p.name for p in out_dir.iterdir()) if out_dir.exists() else []
        assert set(left) <= {".profile-checks"}, left  # (check's cache of a profile that passed, at most)
