"""`rollout8 plan`: check once, render in process, the node env from render's one builder, the Plan model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rollout8.cli import main
from rollout8.runspec import check as check_module
from rollout8.runspec.plan import PLAN_FILE, Plan, build_plan, load_plan
from rollout8.runspec.render import build_env, launch_text, render
from rollout8.runspec.runspec import load_spec

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")


@pytest.fixture
def tiny_spec(tmp_path, model_pair):
    """configs/runs/tiny-cpu.yaml pointing at the session's tiny pair, a real profile and real parquet data."""
    from rollout8.quant.profile import write_profile
    from rollout8.runspec.testdata import make_dataset

    data = make_dataset(tmp_path / "data", 4, 2, 0)
    profile = tmp_path / "profile.pt"
    write_profile(model_pair.bf16, model_pair.int8, profile)
    spec = yaml.safe_load((REPO / "configs" / "runs" / "tiny-cpu.yaml").read_text())
    spec["model"].update(bf16=str(model_pair.bf16), int8=str(model_pair.int8), profile=str(profile))
    spec["data"] = {"train": str(data["train"]), "val": str(data["val"])}
    spec["deploy"].pop("shared_storage", None)  # here on this machine, sent by the controller
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_plan_checks_once_renders_in_process_and_uses_renders_env(tiny_spec, tmp_path, monkeypatch):
    calls = []
    real = check_module.run_checks
    monkeypatch.setattr(check_module, "run_checks", lambda spec, *rest: calls.append(spec.name) or real(spec, *rest))

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"plan started a subprocess: {args}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    plan = build_plan(tiny_spec, tmp_path / "plan", "/opt/rollout8/venv/bin/rollout8")
    assert calls == ["tiny-cpu"], "check's rules run exactly once"
    spec = load_spec(tiny_spec)
    assert plan.env == dict(sorted(build_env(spec)[0].items()))
    # the verl job is render's launch.sh, copied to every node: the env exports, then the verl command
    assert plan.entrypoints["verl"] == f"bash {plan.node_paths['launch']}"
    assert (tmp_path / "plan" / "launch.sh").read_text() == launch_text(render(spec))
    assert any(c.what == "launch" and c.dest == plan.node_paths["launch"] for c in plan.copies)
    assert plan.training_steps == spec.verl["trainer.total_training_steps"]
    assert "HCCL_CONNECT_TIMEOUT" not in plan.env  # NPU only
    assert plan.env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"  # CPU too: its NPU resource
    assert plan.env["FLASHRL_CONFIG"] == plan.node_paths["flashrl"]
    assert not (tmp_path / "plan" / "render").exists()
    assert load_plan(tmp_path / "plan" / PLAN_FILE) == plan


def test_plan_is_byte_identical_on_a_rerun_and_its_json_is_the_model(tiny_spec, tmp_path):
    out = tmp_path / "plan"
    first = build_plan(tiny_spec, out, "rollout8")
    text, mtime = (out / PLAN_FILE).read_text(), (out / PLAN_FILE).stat().st_mtime_ns
    second = build_plan(tiny_spec, out, "rollout8")
    assert second.job_id == first.job_id and (out / PLAN_FILE).stat().st_mtime_ns == mtime
    data = json.loads(text)
    assert data["schema"] == 1 and Plan.from_json(data).to_json() == data
    from rollout8.lock import load_lock

    assert data["image"] == load_lock().image_ref()  # the roles' default rollout8_image
    assert Plan.from_json({**data, "image": "other/image:1"}).identity() == first.identity()
    with pytest.raises(ValueError):
        Plan.from_json({**data, "unknown_field": 1})


def test_plan_refuses_a_spec_check_refuses_naming_the_field(tiny_spec, tmp_path, capsys):
    spec = yaml.safe_load(tiny_spec.read_text())
    spec["verl"]["actor_rollout_ref.rollout.mode"] = "async"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec))
    assert main(["plan", str(bad), "-o", str(tmp_path / "p")]) != 0
    err = capsys.readouterr().err
    assert "rollout8 check" in err and "actor_rollout_ref.rollout.mode" in err
    assert not (tmp_path / "p" / PLAN_FILE).exists()
    assert main(["plan", str(bad), "-o", str(tmp_path / "p"), "--no-check"]) == 0
    assert "actor_rollout_ref.rollout.mode=async" in (tmp_path / "p" / "launch.sh").read_text()


def test_plan_remembers_a_passing_profile_check_until_an_input_changes(tiny_spec, tmp_path, monkeypatch):
    """The plan step's profile check (torch, a sampled verify-quant: seconds) runs once per set of inputs: a
    second plan of the same files does not run it; a profile with another mtime runs it again."""
    calls = []
    real = check_module._check_profile
    monkeypatch.setattr(check_module, "_check_profile", lambda c, s: calls.append(1) or real(c, s))
    out = tmp_path / "plan"
    build_plan(tiny_spec, out, "rollout8")
    build_plan(tiny_spec, out, "rollout8")
    assert len(calls) == 1
    profile = tmp_path / "profile.pt"
    os.utime(profile, ns=(profile.stat().st_mtime_ns + 10**9,) * 2)
    build_plan(tiny_spec, out, "rollout8")
    assert len(calls) == 2


def test_send_tree_links_every_copy_and_removes_only_its_own_stale_links(tmp_path):
    """send/ mirrors the deploy root with one link per copy; a copy dropped from the plan loses its link, and the
    cleanup never walks into a linked directory (the user's model, with links of its own, stays intact)."""
    from rollout8.runspec.plan import arrival_list, write_send_tree

    model = tmp_path / "ctl" / "model"
    model.mkdir(parents=True)
    (model / "blob").write_bytes(b"w" * 10)
    (model / "weights.safetensors").symlink_to(model / "blob")  # a Hugging Face snapshot's kind of link
    data = tmp_path / "ctl" / "train.parquet"
    data.write_bytes(b"d" * 5)
    copies = [{"what": "bf16", "src": str(model), "dest": "/deploy/models/bf16", "kind": "dir"},
              {"what": "train", "src": str(data), "dest": "/deploy/data/train.parquet", "kind": "file"}]
    sums = {"bf16/blob": "a", "bf16/weights.safetensors": "a", "train": "b"}
    tree = tmp_path / "send"
    write_send_tree(tree, arrival_list(copies, sums, "/deploy"))
    assert os.readlink(tree / "models" / "bf16") == str(model)
    assert os.readlink(tree / "data" / "train.parquet") == str(data)
    write_send_tree(tree, arrival_list(copies[:1], {"bf16/blob": "a", "bf16/weights.safetensors": "a"}, "/deploy"))
    assert not (tree / "data").exists() and (tree / "models" / "bf16").is_symlink()
    assert (model / "weights.safetensors").is_symlink() and (model / "blob").read_bytes() == b"w" * 10


def test_plan_is_the_plan_roles_one_command_profile_when_missing_and_verify_quant_kept(tiny_spec, tmp_path, capsys):
    """`rollout8 plan --profile missing --verify-quant`: what the plan role runs, in one call. A missing profile is
    refused without the flag, computed with it; the full verify-quant runs once and its report is kept under the
    artifacts' checksums (a re-run reads it, does not verify again)."""
    spec = yaml.safe_load(tiny_spec.read_text())
    profile = Path(spec["model"]["profile"])
    profile.unlink()
    out = tmp_path / "plan"
    assert main(["plan", str(tiny_spec), "-o", str(out)]) != 0
    assert "model.profile" in capsys.readouterr().err and not profile.exists()

    assert main(["plan", str(tiny_spec), "-o", str(out), "--profile", "missing", "--verify-quant"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["profile_written"] == str(profile) and profile.is_file()
    report = Path(first["verify_quant"]["report"])
    assert first["verify_quant"]["cached"] is False and json.loads(report.read_text())["passed"] is True
    stamp = report.stat().st_mtime_ns

    assert main(["plan", str(tiny_spec), "-o", str(out), "--profile", "missing", "--verify-quant"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["profile_written"] is None and again["verify_quant"] == {"report": str(report), "cached": True}
    assert report.stat().st_mtime_ns == stamp


def test_shared_storage_paths_are_what_the_training_container_mounts_and_one_it_cannot_is_refused(
        tiny_spec, tmp_path, capsys):
    """deploy.shared_storage: the models and data are read where the spec names them; the plan lists what the
    training container must mount at the same path (outermost once, nothing the deploy root or the shared directory
    holds already), and refuses, naming the field, a path that a mount cannot carry or would hide the image with."""
    spec = yaml.safe_load(tiny_spec.read_text())
    spec["deploy"] = {"shared_storage": True}
    spec["cluster"]["shared_dir"] = str(tmp_path / "shared")
    spec["data"]["val"] = str(tmp_path / "shared" / "val.parquet")  # inside shared_dir: mounted already
    (tmp_path / "shared").mkdir()
    Path(spec["data"]["val"]).write_bytes(Path(yaml.safe_load(tiny_spec.read_text())["data"]["val"]).read_bytes())
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(spec))
    plan = build_plan(path, tmp_path / "plan", "rollout8")
    assert plan.copies and all(c.what in ("flashrl", "launch") for c in plan.copies)  # nothing else is copied
    expected = sorted({spec["model"]["bf16"], spec["model"]["int8"], spec["model"]["profile"], spec["data"]["train"]})
    assert plan.mounts == expected
    # the mounts do not change the job's identity (they follow from node_paths)
    assert Plan.from_json({**plan.to_json(), "mounts": []}).identity() == plan.identity()

    # a profile inside a mounted model directory (a copy of the session's pair: never write into it)
    shutil.copytree(spec["model"]["int8"], tmp_path / "int8")
    spec["model"]["int8"] = str(tmp_path / "int8")
    spec["model"]["profile"] = str(tmp_path / "int8" / "profile.pt")
    shutil.copyfile(tmp_path / "profile.pt", spec["model"]["profile"])
    path.write_text(yaml.safe_dump(spec))
    assert build_plan(path, tmp_path / "plan", "rollout8").mounts == sorted(
        {spec["model"]["bf16"], spec["model"]["int8"], spec["data"]["train"]})

    for bad, problem in (("/usr/share/models/int8", "lies inside /usr, the image's own software"),
                         ("/opt", "is a top-level system directory"),
                         ("/data/a:b/int8", "holds ':' or ','")):
        spec["model"]["int8"] = bad
        path.write_text(yaml.safe_dump(spec))
        assert main(["plan", str(path), "-o", str(tmp_path / "bad")]) != 0
        err = capsys.readouterr().err
        assert f"model.int8: {bad} {problem}" in err and "the training container could not see it" in err, err
        assert not (tmp_path / "bad" / PLAN_FILE).exists()


def test_plan_no_artifacts_previews_a_spec_whose_files_do_not_exist(tmp_path, monkeypatch, capsys):
    """`plan --no-artifacts` on the shipped 7B spec (its model, profile and data are not on this machine): the node
    paths, copies and mounts on stdout, one line naming what it skipped, nothing written anywhere, no job id (the
    artifacts' checksums are the job's identity); every error that needs no file is still refused, and without the
    flag the same spec is refused for its files."""
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load((REPO / "configs" / "runs" / "qwen2.5-7b-int8-gsm8k.yaml").read_text())
    assert not Path(raw["model"]["bf16"]).exists()
    spec = tmp_path / "early.yaml"
    spec.write_text(yaml.safe_dump(raw))
    assert main(["plan", "--no-artifacts", str(spec)]) == 0
    out, err = capsys.readouterr()
    preview = json.loads(out)
    assert preview["preview"] is True and preview["job_id"] is None
    assert "preview, nothing written" in err and "profile" in err and "checksums" in err, err
    root = load_spec(spec).deploy_root
    copied = {c["what"]: c for c in preview["copies"]}
    assert set(copied) == {"bf16", "int8", "profile", "train", "val", "flashrl", "launch"}
    assert copied["bf16"]["src"] == raw["model"]["bf16"] and copied["bf16"]["kind"] == "dir"
    assert all(c["dest"].startswith(root + "/") for c in preview["copies"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["early.yaml"], "a preview writes nothing"

    assert main(["plan", str(spec), "-o", str(tmp_path / "plan")]) != 0  # the plan the nodes take needs the files
    assert "[flashrl-paths]" in capsys.readouterr().err
    assert not (tmp_path / "plan" / PLAN_FILE).exists()

    raw["verl"]["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] = 1000  # above the mini-batch per rank
    spec.write_text(yaml.safe_dump(raw))
    assert main(["plan", "--no-artifacts", str(spec)]) != 0
    err = capsys.readouterr().err
    assert "ppo_micro_batch_size_per_gpu" in err and "does not exist" not in err, err

    assert main(["plan", "--no-artifacts", "--verify-quant", str(spec)]) != 0
    assert "--verify-quant reads the artifacts" in capsys.readouterr().err


def test_plan_no_artifacts_takes_shared_storage_paths_only_the_nodes_have(tmp_path, capsys):
    """deploy.shared_storage: the model and data live on the nodes' shared storage, not on the controller. The
    preview lists them as the training container's mounts (nothing copied) instead of refusing them."""
    raw = yaml.safe_load((REPO / "configs" / "runs" / "qwen2.5-7b-int8-gsm8k.yaml").read_text())
    raw["deploy"] = {**raw.get("deploy", {}), "shared_storage": True}
    spec = tmp_path / "shared.yaml"
    spec.write_text(yaml.safe_dump(raw))
    assert main(["plan", "--no-artifacts", str(spec)]) == 0
    preview = json.loads(capsys.readouterr().out)
    assert {c["what"] for c in preview["copies"]} == {"flashrl", "launch"}
    assert raw["model"]["bf16"] in preview["mounts"] and raw["data"]["train"] in preview["mounts"]


def test_a_controller_without_the_models_plans_from_the_heads_checksums(tiny_spec, tmp_path, capsys, monkeypatch):
    """deploy.shared_storage on a jump host: the head plans the spec where the models are (here: where they exist),
    the controller plans it again from that plan's checksums and parameter count, reading no model file (here: the
    files are gone), and both get the same job id and the same files to send."""
    raw = yaml.safe_load(tiny_spec.read_text())
    for what in ("bf16", "int8"):  # a copy of the session's pair: the controller's below loses it
        raw["model"][what] = str(shutil.copytree(raw["model"][what], tmp_path / "share" / what))
    raw["deploy"] = {"root": "/var/lib/rollout8/runs/tiny-cpu", "shared_storage": True}
    raw["data"]["reward"] = str(REPO / "configs" / "runs" / "tiny-cpu.yaml")  # any file: hashed, not run
    spec = tmp_path / "shared.yaml"
    spec.write_text(yaml.safe_dump(raw))
    cli = "/usr/local/bin/rollout8"
    head = build_plan(spec, tmp_path / "head", cli)
    assert head.job_id and head.model_parameters

    # the controller: the model directories are not there (a jump host); the head's plan is all it has
    for what in ("bf16", "int8"):
        shutil.move(raw["model"][what], tmp_path / f"away-{what}")
    reads = []
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: reads.append(str(self)) or real_open(self, *a, **k))
    assert main(["plan", str(spec), "-o", str(tmp_path / "ctl"), "--node-cli", cli,
                 "--artifacts-from", str(tmp_path / "head" / PLAN_FILE)]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["job_id"] == head.job_id
    mine = load_plan(tmp_path / "ctl" / PLAN_FILE)
    assert mine.sha256 == head.sha256 and mine.model_parameters == head.model_parameters
    assert mine.checkpoint_bytes_needed == head.checkpoint_bytes_needed > 0
    assert (tmp_path / "ctl" / "launch.sh").read_text() == (tmp_path / "head" / "launch.sh").read_text()
    assert not [r for r in reads if r.startswith(str(Path(raw["model"]["bf16"]).parent) + "/")], reads

    # another version of the spec cannot take that plan's checksums: the job ids differ, and it says so
    raw["verl"]["trainer.total_training_steps"] = 4
    spec.write_text(yaml.safe_dump(raw))
    assert main(["plan", str(spec), "-o", str(tmp_path / "ctl2"), "--node-cli", cli,
                 "--artifacts-from", str(tmp_path / "head" / PLAN_FILE)]) != 0
    assert "the head planned job " + head.job_id in capsys.readouterr().err
    assert not (tmp_path / "ctl2" / PLAN_FILE).exists()
    # nor can a spec that copies its files (the controller must read what it sends), nor a second profile run
    raw["deploy"]["shared_storage"] = False
    spec.write_text(yaml.safe_dump(raw))
    assert main(["plan", str(spec), "-o", str(tmp_path / "ctl3"),
                 "--artifacts-from", str(tmp_path / "head" / PLAN_FILE)]) != 0
    assert "only a deploy.shared_storage spec" in capsys.readouterr().err
    assert main(["plan", str(spec), "-o", str(tmp_path / "ctl3"), "--profile", "missing",
                 "--artifacts-from", str(tmp_path / "head" / PLAN_FILE)]) != 0
    assert "--profile missing ran on the head" in capsys.readouterr().err
