"""`rollout8 render`: golden files for every shipped run spec, determinism, and what the launch really gets.

Regenerate the golden files after an intended change (then review the diff):
    ROLLOUT8_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_render.py -k golden
Each shipped spec is copied to DIR/configs/runs/ first, so its relative paths (tiny-cpu) point into DIR where
nothing exists; DIR is written as <DIR> in the golden files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rollout8.cli import main
from rollout8.runspec import verl_keys
from rollout8.runspec.render import FLASHRL_FILE, MANIFEST_FILE, render, write_outputs
from rollout8.runspec.runspec import load_spec

REPO = Path(__file__).resolve().parents[2]
SPECS = sorted((REPO / "configs" / "runs").glob("*.yaml"))
GOLDEN = Path(__file__).resolve().parent / "golden" / "render"
OUTPUTS = ("flashrl.yaml", "rollout8.env", "launch.sh", "render.json")


def render_copy(spec: Path, base: Path, out: Path) -> dict[str, str]:
    runs = base / "configs" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    shutil.copy(spec, runs / spec.name)
    write_outputs(render(load_spec(runs / spec.name)), out)
    # the checkpoint directory's key digests the spec with its paths resolved (here under tmp_path): <KEY>
    return {name: re.sub(r"/[0-9a-f]{12}/checkpoints", "/<KEY>/checkpoints",
                         (out / name).read_text().replace(str(base), "<DIR>"))
            for name in OUTPUTS if (out / name).exists()}


def test_every_shipped_spec_is_covered():
    assert {p.stem for p in SPECS} == {"qwen2.5-7b-int8-gsm8k", "qwen2.5-7b-bf16-gsm8k", "qwen2.5-7b-int8-dapo",
                                       "qwen2.5-32b-int8-2node", "tiny-cpu"}


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_golden(spec, tmp_path):
    got = render_copy(spec, tmp_path / "base", tmp_path / "out")
    golden = GOLDEN / spec.stem
    if os.environ.get("ROLLOUT8_REGEN_GOLDEN") == "1":
        shutil.rmtree(golden, ignore_errors=True)
        golden.mkdir(parents=True)
        for name, text in got.items():
            (golden / name).write_text(text)
    want = {p.name: p.read_text() for p in sorted(golden.iterdir())}
    assert sorted(got) == sorted(want), "different set of files (regenerate: see the module docstring)"
    for name in want:
        assert got[name] == want[name], f"{spec.stem}/{name} differs from the golden file"


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_deterministic(spec, tmp_path):
    first = render_copy(spec, tmp_path / "base", tmp_path / "one")
    second = render_copy(spec, tmp_path / "base", tmp_path / "two")
    assert first == second


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_rendered_command_passes_key_validation(spec):
    """Every override render emits (derived and the spec's own) exists at the verl pin."""
    rendered = render(load_spec(spec))
    problems = {o.raw_key: verl_keys.key_problem(o) for o in rendered.overrides}
    assert {k: v for k, v in problems.items() if v} == {}


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_shipped_specs_pass_check_but_for_missing_local_artifacts(spec):
    from rollout8.runspec.check import run_checks

    findings = run_checks(load_spec(spec))
    other = [f.line() for f in findings if f.level != "info" and not (
        f.rule == "flashrl-paths" and "does not exist here" in f.message)]
    assert other == []


def test_int8_command_and_env():
    spec = load_spec(REPO / "configs/runs/qwen2.5-7b-int8-gsm8k.yaml")
    rendered = render(spec)
    argv = rendered.argv
    root = "/var/lib/rollout8/runs/qwen2.5-7b-int8-gsm8k"
    assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    for arg in ("actor_rollout_ref.rollout.mode=sync", "actor_rollout_ref.rollout.calculate_log_probs=true",
                "algorithm.rollout_correction.rollout_is=sequence",
                "algorithm.rollout_correction.rollout_is_threshold=2.0", "trainer.device=npu", "trainer.nnodes=1",
                "trainer.n_gpus_per_node=8", f"actor_rollout_ref.model.path={root}/models/bf16",
                f"data.train_files={root}/data/train.parquet",
                f"+ray_kwargs.ray_init.runtime_env.env_vars.FLASHRL_CONFIG='{root}/flashrl.yaml'",
                "+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_V1='1'",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "trainer.logger=console"):
        assert arg in argv
    assert len({a.split("=")[0] for a in argv[3:]}) == len(argv) - 3  # no key twice
    env = rendered.env
    assert env["FLASHRL_CONFIG"] == f"{root}/flashrl.yaml" and env["FLASHRL_LOGGING_LEVEL"] == "DEBUG"
    assert env["FLASHRL_LMHEAD_FP32"] == "0" and env["VLLM_USE_V1"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
    assert env["HCCL_CONNECT_TIMEOUT"] == "600" and "HCCL_IF_IP" in rendered.per_node_env
    [entry] = rendered.flashrl["configs"]
    assert entry["model"] == f"{root}/models/int8" and entry["profile"] == f"{root}/profile.pt"


def test_bf16_baseline_has_no_flashrl(tmp_path):
    spec = load_spec(REPO / "configs/runs/qwen2.5-7b-bf16-gsm8k.yaml")
    rendered = render(spec)
    assert rendered.flashrl is None and not any(k.startswith("FLASHRL") for k in rendered.env)
    assert "actor_rollout_ref.rollout.mode=sync" in rendered.argv
    (tmp_path / FLASHRL_FILE).write_text("stale")  # a stale file from an earlier int8 render is removed
    write_outputs(rendered, tmp_path)
    assert not (tmp_path / FLASHRL_FILE).exists()
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert [a["name"] for a in manifest["artifacts"]] == ["bf16", "train", "val"]


def test_network_settings_reach_the_env():
    rendered = render(load_spec(REPO / "configs/runs/qwen2.5-32b-int8-2node.yaml"))
    env = rendered.env
    for key in ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        assert env[key] == "enp189s0f0"
    assert env["HCCL_HOST_SOCKET_PORT_RANGE"] == "61000-61050" and env["HCCL_EXEC_TIMEOUT"] == "3600"
    assert env["HCCL_NPU_SOCKET_PORT_RANGE"] == "61000-61050"
    assert "trainer.nnodes=2" in rendered.argv


def test_hccl_connect_timeout_is_bounded_unless_the_spec_sets_it(tmp_path):
    """No shipped spec keeps the upstream recipe's 3000 s (a rank that cannot connect would hang 50 minutes before
    HCCL says anything) unless its reason is written beside it; a spec that says nothing waits 600 s."""
    for path in sorted((REPO / "configs/runs").glob("*.yaml")):
        spec = load_spec(path)
        if spec.cluster.accelerator != "npu":
            continue
        timeout = render(spec).env["HCCL_CONNECT_TIMEOUT"]
        lines = [line for line in path.read_text().splitlines() if "hccl_connect_timeout" in line]
        assert timeout == "600" or all("#" in line for line in lines), (path.name, timeout, lines)
    spec = yaml.safe_load((REPO / "configs/runs/qwen2.5-7b-int8-gsm8k.yaml").read_text())
    spec["cluster"].setdefault("network", {})["hccl_connect_timeout"] = 3000
    explicit = tmp_path / "explicit.yaml"
    explicit.write_text(yaml.safe_dump(spec))
    assert render(load_spec(explicit)).env["HCCL_CONNECT_TIMEOUT"] == "3000"  # a user's own value is kept


def test_hccl_host_ports_default_above_the_ephemeral_range(tmp_path):
    """Linux's default ephemeral range is 32768-60999 (CANN's own host ports, 60000-60015, lie inside it): the
    default range lies above it; null gives CANN's default back (no variable)."""
    path = REPO / "configs/runs/qwen2.5-7b-int8-gsm8k.yaml"
    low, high = (int(x) for x in render(load_spec(path)).env["HCCL_HOST_SOCKET_PORT_RANGE"].split("-"))
    assert 60999 < low <= high <= 65535
    spec = yaml.safe_load(path.read_text())
    spec["cluster"].setdefault("network", {})["hccl_host_socket_port_range"] = None
    unset = tmp_path / "cann-default.yaml"
    unset.write_text(yaml.safe_dump(spec))
    assert "HCCL_HOST_SOCKET_PORT_RANGE" not in render(load_spec(unset)).env


def test_launch_script_runs_the_manifest_command(tmp_path):
    """launch.sh exports the env and execs exactly the manifest's argv (a python3 stand-in records both)."""
    write_outputs(render(load_spec(REPO / "configs/runs/qwen2.5-7b-int8-gsm8k.yaml")), tmp_path / "r")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$RECORD.argv"\nenv > "$RECORD.env"\n')
    (fake / "python3").chmod(0o755)
    record = tmp_path / "rec"
    subprocess.run(["bash", str(tmp_path / "r/launch.sh"), "trainer.total_epochs=1"], check=True, timeout=60,
                   env={"PATH": f"{fake}:/usr/bin:/bin", "RECORD": str(record)})
    manifest = json.loads((tmp_path / "r/render.json").read_text())
    argv = record.with_suffix(".argv").read_text().splitlines()
    assert argv == manifest["command"][1:] + ["trainer.total_epochs=1"]
    env = dict(line.split("=", 1) for line in record.with_suffix(".env").read_text().splitlines() if "=" in line)
    assert {k: env[k] for k in manifest["env"]} == manifest["env"]
    lines = (tmp_path / "r/rollout8.env").read_text().splitlines()
    assert dict(line.split("=", 1) for line in lines if not line.startswith("#")) == manifest["env"]


def test_manifest_checksums_local_artifacts(model_pair, tmp_path):
    (tmp_path / "data").mkdir()
    for name in ("train", "val"):
        (tmp_path / "data" / f"{name}.parquet").write_bytes(name.encode())
    raw = yaml.safe_load((REPO / "configs/runs/tiny-cpu.yaml").read_text())
    raw["model"].update(bf16=str(model_pair.bf16), int8=str(model_pair.int8), profile=str(tmp_path / "p.pt"))
    raw["data"] = {"train": "data/train.parquet", "val": "data/val.parquet"}
    raw["deploy"].pop("shared_storage")  # on this machine, copied to the nodes
    (tmp_path / "p.pt").write_bytes(b"profile")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    write_outputs(render(load_spec(tmp_path / "run.yaml")), tmp_path / "out")
    manifest = json.loads((tmp_path / "out/render.json").read_text())
    by_name = {a["name"]: a for a in manifest["artifacts"]}
    assert by_name["train"]["local"] == str(tmp_path / "data/train.parquet")
    assert by_name["train"]["sha256"] == hashlib.sha256(b"train").hexdigest()
    assert by_name["profile"]["node"] == "/var/lib/rollout8/runs/tiny-cpu/profile.pt"
    files = {f["path"]: f for f in by_name["int8"]["files"]}
    assert files["config.json"]["sha256"] == hashlib.sha256((model_pair.int8 / "config.json").read_bytes()).hexdigest()
    flashrl = by_name["flashrl"]
    assert flashrl["sha256"] == hashlib.sha256((tmp_path / "out/flashrl.yaml").read_bytes()).hexdigest()


def test_render_cli_refuses_a_spec_check_refuses(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["render", str(REPO / "configs/runs/qwen2.5-7b-int8-gsm8k.yaml"), "-o", str(out)]) == 1
    assert "does not exist here" in capsys.readouterr().out and not out.exists()
    assert main(["render", str(REPO / "configs/runs/qwen2.5-7b-int8-gsm8k.yaml"), "-o", str(out), "--no-check"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)


@pytest.mark.skipif(not verl_keys.hydra_available(), reason="hydra-core is not installed")
def test_hydra_composes_the_rendered_overrides(tmp_path):
    """With hydra and verl 0.6.1's config tree (keys equal the pin's), every rendered override composes."""
    sys_path = str(tmp_path)
    from upstream_wheels import VERL_STAND_IN_VERSION, unpack, wheel

    unpack(wheel("verl", VERL_STAND_IN_VERSION), tmp_path, "verl")
    config_dir = tmp_path / "verl" / "trainer" / "config"
    for spec in SPECS:
        rendered = render(load_spec(spec))
        assert verl_keys.hydra_problems(rendered.overrides, config_dir) == {}, spec.name
    bad = [verl_keys.Override("", "actor_rollout_ref.actor.tis_imp_ratio_cap", 2.0)]
    assert verl_keys.hydra_problems(bad, config_dir), sys_path


CPU_HOOK = "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rollout8_cpu_bridges.install"


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_only_cpu_specs_name_the_cpu_bridges(spec):
    """The simulated tier's CPU bridges are loaded through one rendered override, for accelerator: cpu only."""
    rendered = render(load_spec(spec))
    named = [arg for arg in rendered.argv if "rollout8_cpu_bridges" in arg]
    if rendered.spec.cluster.accelerator == "cpu":
        assert named == [CPU_HOOK]
    else:
        assert named == []
        assert not any("rollout8_cpu_bridges" in value for value in rendered.env.values())


def test_the_product_never_imports_the_cpu_bridges():
    """Nothing under src/ or docker/ imports or copies virtual/cpu_bridges; render only names the hook."""
    repo = Path(__file__).resolve().parents[2]
    hits = []
    for path in [*(repo / "src").rglob("*.py"), *(repo / "docker").rglob("*")]:
        if path.is_file():
            text = path.read_text(errors="replace")
            if "cpu_bridges" in text:
                hits.append(path.relative_to(repo).as_posix())
    assert hits == ["src/rollout8/runspec/render.py"], hits
    render_py = (repo / "src/rollout8/runspec/render.py").read_text()
    assert "import rollout8_cpu_bridges" not in render_py and "from rollout8_cpu_bridges" not in render_py
    dockerignore = (repo / ".dockerignore").read_text() if (repo / ".dockerignore").is_file() else ""
    dockerfile = (repo / "docker" / "Dockerfile").read_text()
    assert "virtual/cpu_bridges" not in dockerfile and "COPY virtual " not in dockerfile, dockerignore


def test_custom_reward_is_rendered_with_its_node_path(tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "runs" / "tiny-cpu.yaml").read_text())
    rendered = render(load_spec(REPO / "configs" / "runs" / "tiny-cpu.yaml"))
    # deploy.shared_storage: read where the spec names it, on every node
    assert rendered.value("custom_reward_function.path") == (True, spec["data"]["reward"])
    assert spec["data"]["reward"].startswith("/mnt/rollout8-models/")
    assert rendered.value("custom_reward_function.name") == (True, "compute_score")
    del spec["data"]["reward"]
    path = tmp_path / "no-reward.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert render(load_spec(path)).value("custom_reward_function.path") == (False, None)


def test_shared_dir_puts_checkpoints_there_keyed_by_the_runs_resume_identity_and_resumes(tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "runs" / "tiny-cpu.yaml").read_text())
    base = REPO / "configs" / "runs"
    for section in ("model", "data"):
        spec[section] = {k: (str((base / v).resolve()) if isinstance(v, str) and v.startswith("..") else v)
                         for k, v in spec[section].items()}
    spec["cluster"]["shared_dir"] = "/mnt/shared/"
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(spec))
    first = render(load_spec(path))
    found, ckpt = first.value("trainer.default_local_dir")
    assert found and ckpt.startswith("/mnt/shared/tiny-cpu/") and ckpt.endswith("/checkpoints")
    assert first.value("trainer.resume_mode") == (True, "auto")
    assert render(load_spec(path)).value("trainer.default_local_dir")[1] == ckpt  # a resubmission finds it
    spec["verl"]["actor_rollout_ref.actor.optim.lr"] = 2.0e-3
    path.write_text(yaml.safe_dump(spec))
    # issue 28: found by the run's resume identity: a new learning rate resumes, a new batch shape starts afresh
    assert render(load_spec(path)).value("trainer.default_local_dir")[1] == ckpt
    spec["verl"]["data.train_batch_size"] = 12
    path.write_text(yaml.safe_dump(spec))
    assert render(load_spec(path)).value("trainer.default_local_dir")[1] != ckpt
    spec["cluster"]["shared_dir"] = "relative/dir"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(Exception, match="must be an absolute path"):
        load_spec(path)
    del spec["cluster"]["shared_dir"]
    path.write_text(yaml.safe_dump(spec))
    assert render(load_spec(path)).value("trainer.resume_mode") == (False, None)


# ------------------------------------------------------------------ checkpoints on by default
def render_verl(tmp_path, **changes):
    """tiny-cpu with its verl block changed: a key -> value, or -> None to leave the key out."""
    spec = yaml.safe_load((REPO / "configs" / "runs" / "tiny-cpu.yaml").read_text())
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            spec["verl"].pop(key, None)
        else:
            spec["verl"][key] = value
    path = tmp_path / "ckpt.yaml"
    path.write_text(yaml.safe_dump(spec))
    return render(load_spec(path))


@pytest.mark.parametrize("total, every", [(50, 5), (3, 1), (95, 10), (100, 10), (101, 11), ("40", 4)])
def test_unset_save_freq_is_every_tenth_of_total_training_steps(tmp_path, total, every):
    rendered = render_verl(tmp_path, trainer__save_freq=None, trainer__total_training_steps=total)
    assert rendered.value("trainer.save_freq") == (True, every)
    assert f"trainer.save_freq={every}" in rendered.argv  # verl gets it like any other override
    assert "trainer.save_freq" in rendered.derived_keys
    assert rendered.derived_from["trainer.save_freq"] == f"every 10% of trainer.total_training_steps {int(total)}"


def test_unset_save_freq_without_total_training_steps_is_the_fixed_default(tmp_path):
    from rollout8.runspec.render import SAVE_FREQ_STEPS

    rendered = render_verl(tmp_path, trainer__save_freq=None, trainer__total_training_steps=None,
                           trainer__total_epochs=2)
    assert SAVE_FREQ_STEPS == 20 and rendered.value("trainer.save_freq") == (True, 20)
    assert "without trainer.total_training_steps" in rendered.derived_from["trainer.save_freq"]


@pytest.mark.parametrize("freq", [-1, 0, 3, 7, "5"])
def test_an_explicit_save_freq_is_kept(tmp_path, freq):
    rendered = render_verl(tmp_path, trainer__save_freq=freq, trainer__total_training_steps=100)
    assert rendered.value("trainer.save_freq") == (True, freq)
    assert [a for a in rendered.argv if a.startswith("trainer.save_freq=")] == [f"trainer.save_freq={freq}"]
    assert "trainer.save_freq" not in rendered.derived_from


def test_retention_defaults_to_two_unless_set_or_checkpoints_are_off(tmp_path):
    derived = render_verl(tmp_path, trainer__save_freq=None)
    assert derived.value("trainer.max_actor_ckpt_to_keep") == (True, 2)
    assert "trainer.max_actor_ckpt_to_keep=2" in derived.argv
    assert render_verl(tmp_path, trainer__save_freq=3).value("trainer.max_actor_ckpt_to_keep") == (True, 2)
    kept = render_verl(tmp_path, trainer__save_freq=None, trainer__max_actor_ckpt_to_keep=5)
    assert kept.value("trainer.max_actor_ckpt_to_keep") == (True, 5)
    assert set(kept.derived_from) == {"trainer.save_freq"}
    off = render_verl(tmp_path, trainer__save_freq=-1)
    assert off.value("trainer.max_actor_ckpt_to_keep") == (False, None) and off.derived_from == {}
    # GRPO has no critic: its retention is verl's
    assert derived.value("trainer.max_critic_ckpt_to_keep") == (False, None)


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_every_shipped_spec_saves_checkpoints_and_bounds_them(spec):
    """No shipped spec trains for hours without a checkpoint to resume from: trainer.save_freq > 0 (derived, or
    tiny-cpu's own 3), and a retention limit."""
    rendered = render(load_spec(spec))
    found, freq = rendered.value("trainer.save_freq")
    assert found and int(freq) > 0
    assert rendered.value("trainer.max_actor_ckpt_to_keep") == (True, 2)
