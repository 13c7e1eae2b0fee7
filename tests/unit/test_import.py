"""`rollout8 import SCRIPT.sh` and `rollout8 render SPEC --against SCRIPT.sh`: scripts of the three verl families
(written here in their style, not copied) become specs that render what the scripts give verl."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout8.cli import main
from rollout8.runspec.importer import canonical, differences, hydra_reads, rendered_overrides, script_overrides
from rollout8.runspec.render import render
from rollout8.runspec.runspec import load_spec
from rollout8.runspec.shell_script import read_script

# MindSpeed-RL style: a launcher that runs a config script next to it and tees its log
LAUNCHER = """\
#!/bin/bash
# GRPO with int8 rollouts on one A2 node
export HCCL_CONNECT_TIMEOUT=3600
export HCCL_EXEC_TIMEOUT=3600

bash configs/grpo_tiny_int8_A2.sh 2>&1 | tee logs/grpo_tiny_int8_A2.log
"""
CONFIG = """\
#!/bin/bash
set -x
export VLLM_USE_V1=1
export FLASHRL_CONFIG=/data/flashrl/int8.yaml   # the recipe's own FlashRL config
export FLASHRL_LMHEAD_FP32=0
export TASK_QUEUE_ENABLE=2
export CPU_AFFINITY_CONF='1'

MODEL_PATH=${MODEL_PATH:-/data/models/Qwen2.5-7B}
DATA_DIR=${DATA_DIR:=/data/gsm8k}
NNODES=1
NPUS_PER_NODE="8"
ROLLOUT_TP=4

python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$DATA_DIR/train.parquet \\
    data.val_files="${DATA_DIR}/test.parquet" \\
    data.train_batch_size=16 \\
    data.max_prompt_length=2048 \\
    data.max_response_length=10240 \\
    data.filter_overlong_prompts=True \\
    data.truncation='error' \\
    actor_rollout_ref.model.path=${MODEL_PATH} \\
    actor_rollout_ref.model.use_remove_padding=True \\
    actor_rollout_ref.actor.optim.lr=5e-8 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    actor_rollout_ref.actor.entropy_coeff=0 \\
    actor_rollout_ref.actor.fsdp_config.param_offload=False \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \\
    actor_rollout_ref.rollout.n=4 \\
    actor_rollout_ref.rollout.enable_chunked_prefill=False \\
    actor_rollout_ref.rollout.max_num_batched_tokens=12288 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \\
    +actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager=True \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 \\
    algorithm.rollout_correction.rollout_is=sequence \\
    algorithm.rollout_correction.rollout_is_threshold=2.0 \\
    algorithm.use_kl_in_reward=False \\
    ++trainer.val_before_train=False \\
    trainer.logger=['console','tensorboard'] \\
    trainer.project_name='verl_grpo_example_gsm8k' \\
    trainer.experiment_name=qwen2_5_7b_int8 \\
    trainer.n_gpus_per_node=$NPUS_PER_NODE \\
    trainer.nnodes=$NNODES \\
    trainer.device=npu \\
    trainer.save_freq=-1 \\
    trainer.test_freq=-1 \\
    trainer.total_epochs=1 "$@"
"""
# verl examples style: set -x, one command, bf16, extra arguments passed through
VERL_EXAMPLE = """\
set -x

export VLLM_ATTENTION_BACKEND=XFORMERS

python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=/data/gsm8k/train.parquet \\
    data.val_files=/data/gsm8k/test.parquet \\
    data.train_batch_size=32 \\
    data.max_prompt_length=1024 \\
    data.max_response_length=1024 \\
    actor_rollout_ref.model.path=/data/models/Qwen2.5-7B-Instruct \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.n=5 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \\
    trainer.logger=[console] \\
    trainer.project_name=verl_grpo_example_gsm8k \\
    trainer.n_gpus_per_node=8 \\
    trainer.nnodes=1 \\
    trainer.device=npu \\
    trainer.total_epochs=15 $@
"""
# a job submitted to a running Ray cluster, its environment in the runtime env
RAY_SUBMIT = """\
#!/usr/bin/env bash
RAY_ADDRESS=${RAY_ADDRESS:-"http://127.0.0.1:8265"}
export VLLM_USE_V1=1

ray job submit --address=${RAY_ADDRESS} \\
    --runtime-env-json='{"env_vars": {"HCCL_CONNECT_TIMEOUT": "1800", "VLLM_ASCEND_ENABLE_NZ": "0"}}' \\
    -- python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=/shared/data/train.parquet \\
    data.val_files=/shared/data/test.parquet \\
    data.train_batch_size=64 \\
    actor_rollout_ref.model.path=/shared/models/Qwen2.5-7B \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.n=8 \\
    trainer.n_gpus_per_node=8 \\
    trainer.nnodes=1 \\
    trainer.device=npu \\
    trainer.total_training_steps=5 2>&1 | tee job.log
"""


def write(base: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text(text)
    return base / next(iter(files))


CASES = {
    "mindspeed": {"grpo_tiny_int8_A2.sh": LAUNCHER, "configs/grpo_tiny_int8_A2.sh": CONFIG},
    "verl-example": {"run_qwen2_5_7b_grpo_npu.sh": VERL_EXAMPLE},
    "ray-submit": {"run.sh": RAY_SUBMIT},
}


def imported(tmp_path: Path, case: str, *extra: str) -> tuple[int, Path, Path]:
    script = write(tmp_path, CASES[case])
    out = tmp_path / "spec.yaml"
    return main(["import", str(script), "-o", str(out), *extra]), script, out


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_imported_spec_renders_what_the_script_gives_verl(case, tmp_path, capsys):
    code, script, out = imported(tmp_path, case)
    assert code == 0, capsys.readouterr().err
    spec, reading = load_spec(out), read_script(script)
    rendered = render(spec)
    mine, theirs = rendered_overrides(rendered), script_overrides(reading)
    assert len(theirs) >= 12
    # every override of the script, as hydra reads it, is in the render (which adds rollout8's own besides)
    assert {k: canonical(v[1]) for k, v in theirs.items()} == {k: canonical(mine[k][1]) for k in theirs}
    assert {k: mine[k][0] for k in theirs} == {k: v[0] for k, v in theirs.items()}
    # every exported variable too, except the one render writes itself (the FlashRL config's path)
    env = {k: v for k, v in reading.command.env.items() if k != "FLASHRL_CONFIG"}
    assert {k: rendered.env.get(k) for k in env} == env
    assert [d.line() for d in differences(spec, reading) if not d.ours] == []
    assert main(["render", str(out), "--against", str(script)]) == 0


def test_mindspeed_pair_maps_fields_and_owned_variables(tmp_path, capsys):
    code, _, out = imported(tmp_path, "mindspeed")
    err = capsys.readouterr().err
    assert code == 0, err
    spec = load_spec(out)
    assert spec.rollout.quantization == "int8" and spec.model.layout == "ascend"
    assert str(spec.model.bf16) == "/data/models/Qwen2.5-7B" and str(spec.data.train) == "/data/gsm8k/train.parquet"
    assert spec.deploy.shared_storage and (spec.cluster.nnodes, spec.cluster.npus_per_node) == (1, 8)
    assert (spec.cluster.network.hccl_connect_timeout, spec.cluster.network.hccl_exec_timeout) == (3600, 3600)
    assert spec.env == {"TASK_QUEUE_ENABLE": "2", "CPU_AFFINITY_CONF": "1"}
    assert spec.verl["trainer.logger"] == ["console", "tensorboard"]
    assert spec.verl["+actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager"] is True
    assert "trainer.nnodes" not in spec.verl and "actor_rollout_ref.rollout.name" not in spec.verl
    assert "placeholder: model.int8" in err and "/TODO-rollout8-import/int8-model" in out.read_text()
    assert "FLASHRL_CONFIG=/data/flashrl/int8.yaml" in err  # reported, not carried
    assert main(["check", "--no-artifacts", str(out)]) == 0, capsys.readouterr().out


def test_ray_submit_runtime_env_reaches_the_spec(tmp_path, capsys):
    code, _, out = imported(tmp_path, "ray-submit")
    assert code == 0, capsys.readouterr().err
    spec = load_spec(out)
    assert spec.rollout.quantization == "bf16"
    assert spec.cluster.network.hccl_connect_timeout == 1800 and spec.env == {"VLLM_ASCEND_ENABLE_NZ": "0"}


def test_an_unsupported_line_is_reported_with_its_line_and_fails_unless_accepted(tmp_path, capsys):
    launcher = LAUNCHER.replace("bash configs", "for n in 1 2; do\n  echo $n\ndone\nexport RUN_ID=$(date +%s)\n"
                                "ray start --head\nbash configs")
    files = dict(CASES["mindspeed"], **{"grpo_tiny_int8_A2.sh": launcher})
    script = write(tmp_path, files)
    out = tmp_path / "spec.yaml"
    assert main(["import", str(script), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{script}:6: dynamic shell: a for block (lines 6-8" in err
    assert f"{script}:9: dynamic shell: command substitution" in err
    assert f"{script}:10: a command rollout8 does not model: ray start" in err
    assert "--accept-dropped" in err and out.is_file()
    assert main(["import", str(script), "-o", str(out), "--accept-dropped"]) == 0
    assert main(["render", str(out), "--against", str(script)]) == 0


def test_a_changed_override_shows_in_render_against(tmp_path, capsys):
    code, script, out = imported(tmp_path, "verl-example")
    assert code == 0
    capsys.readouterr()
    text = out.read_text()
    assert "  data.train_batch_size: 32\n" in text
    out.write_text(text.replace("  data.train_batch_size: 32\n", "  data.train_batch_size: 64\n")
                   .replace("  actor_rollout_ref.rollout.n: 5\n", "")
                   + "  trainer.save_freq: 10\n")
    assert main(["render", str(out), "--against", str(script)]) == 1
    assert sorted(capsys.readouterr().out.splitlines()) == [
        "different value: override data.train_batch_size: script 32, spec 64",
        "only in the script: override actor_rollout_ref.rollout.n=5",
        "only in the spec: override trainer.save_freq=10"]


def test_the_reader_expands_defaults_and_never_runs_anything(tmp_path):
    marker = tmp_path / "ran"
    script = write(tmp_path, {"s.sh": f"""\
A=${{UNSET:-one}}
B=${{A:+x}}
touch {marker}
C=${{C:=three}}
export X="$A-$C" Y='$A'
python -m verl.trainer.main_ppo k.a=$X "k.b=$Y" k.c="a b" $(touch {marker}) | tee x.log
"""})
    reading = read_script(script)
    assert not marker.exists()
    assert reading.command is None or reading.command.env == {"X": "one-three", "Y": "$A"}
    reasons = [(d.line, d.reason.split(":")[0]) for d in reading.failures]
    assert (3, "a command rollout8 does not model") in reasons  # ${A:+x} (line 2) is read, as bash does
    assert (6, "dynamic shell") in reasons and (2, "dynamic shell") not in reasons


def test_hydra_values_read_as_hydra_reads_them():
    assert hydra_reads("['console','tensorboard']") == ["console", "tensorboard"]
    assert hydra_reads("[console]") == ["console"]
    assert hydra_reads("True") is True and hydra_reads("5e-8") == 5e-8 and hydra_reads("null") is None
    assert canonical(hydra_reads("'8'")) != canonical(hydra_reads("8"))


def test_sourced_scripts_share_variables_and_a_bash_child_keeps_its_own(tmp_path):
    script = write(tmp_path, {
        "run.sh": "source ./env.sh\n. common.sh\nbash child.sh\nexport AFTER=1\n",
        "env.sh": "export A=from-env\nTP=${1:-2}\n",
        "common.sh": "SHELL_ONLY=x\n",
        "child.sh": "export B=$A\nVAL=${SHELL_ONLY:-unset}\n"
                    "python -m verl.trainer.main_ppo a.tp=$TP a.val=$VAL ~a.gone +a.new='x y' \"$@\"\n",
    })
    reading = read_script(script)
    assert reading.failures == []
    assert reading.command.env == {"A": "from-env", "B": "from-env"}  # AFTER comes after the command
    assert reading.command.args == ["a.tp=$TP", "a.val=unset", "~a.gone", "+a.new=x y"]  # TP is not exported
    assert [d.reason.split(";")[0] for d in reading.unresolved] == ["$TP is not set in the script"]


def test_a_value_no_field_takes_is_reported_and_shows_in_render_against(tmp_path, capsys):
    text = VERL_EXAMPLE.replace("trainer.nnodes=1", "trainer.nnodes=$NNODES").replace(
        "data.train_files=/data/gsm8k/train.parquet", "data.train_files=\"['/data/a.parquet','/data/b.parquet']\"")
    script = write(tmp_path, {"run.sh": text})
    out = tmp_path / "spec.yaml"
    assert main(["import", str(script), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "data.train is one path; set it by hand" in err and "placeholder: cluster.nnodes" in err
    assert main(["render", str(out), "--against", str(script)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "different value: override data.train_files: script ['/data/a.parquet','/data/b.parquet'], spec " \
           "/TODO-rollout8-import/train" in lines
    assert "different value: override trainer.nnodes: script '$NNODES', spec 1" in lines


def test_a_scripts_checkpoint_settings_are_carried_even_where_render_would_derive_them(tmp_path, capsys):
    """render derives trainer.save_freq from the verl block (10% of total_training_steps, else 20 steps) and
    max_actor_ckpt_to_keep: a script's own values stay in the spec, never dropped as 'render sets the same'."""
    script = write(tmp_path, {"run.sh": RAY_SUBMIT.replace(
        "trainer.total_training_steps=5", "trainer.total_training_steps=5 trainer.save_freq=20 "
                                          "trainer.max_actor_ckpt_to_keep=2")})
    out = tmp_path / "spec.yaml"
    assert main(["import", str(script), "-o", str(out)]) == 0, capsys.readouterr().err
    spec = load_spec(out)
    assert spec.verl["trainer.save_freq"] == 20 and spec.verl["trainer.max_actor_ckpt_to_keep"] == 2
    assert render(spec).value("trainer.save_freq") == (True, 20)
    assert main(["render", str(out), "--against", str(script)]) == 0


def test_a_script_without_checkpoints_imports_to_render_s_derived_ones(tmp_path, capsys):
    code, script, out = imported(tmp_path, "ray-submit")
    assert code == 0, capsys.readouterr().err
    spec = load_spec(out)
    assert "trainer.save_freq" not in spec.verl and render(spec).value("trainer.save_freq") == (True, 1)
    assert main(["render", str(out), "--against", str(script), "--verbose"]) == 0  # rollout8's own, not a difference
    lines = capsys.readouterr().out.splitlines()
    assert {"set by rollout8: only in the spec: override trainer.save_freq=1",
            "set by rollout8: only in the spec: override trainer.max_actor_ckpt_to_keep=2"} <= set(lines)


# issue 44: the NPU launch scripts verl ships choose values with if/case on an environment variable
CHOOSING = """\
#!/bin/bash
set -x
source ./common.sh
if [ "$DEVICE" = "npu" ]; then
    export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3
    TP=4
elif [[ $DEVICE == gpu* ]]; then TP=2
else
    TP=1
fi
case "$SIZE" in
  7b|7B) BATCH=16 ;;
  32b)
    BATCH=8
    ;;
  *) BATCH=1;;
esac
[ -z "${NNODES:-}" ] && NNODES=1
MODEL_PATH=${MODEL_PATH:-"$HOME/models/Qwen2.5-7B"}
python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=$MODEL_PATH \\
    data.train_files=$DATA/train.parquet data.val_files=$DATA/test.parquet \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=$TP data.train_batch_size=$BATCH trainer.nnodes=$NNODES \\
    trainer.n_gpus_per_node=8 trainer.device=npu
"""


def choosing(tmp_path: Path) -> Path:
    return write(tmp_path, {"run.sh": CHOOSING, "common.sh": "DATA=/data/gsm8k\n"})


def test_an_if_and_a_case_are_chosen_by_env(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", "/root-of-rollout8")  # never read: the script sees only what --env gives
    script, out = choosing(tmp_path), tmp_path / "spec.yaml"
    assert main(["import", str(script), "-o", str(out), "--env", "DEVICE=npu", "--env", "SIZE=7B",
                 "--env", "HOME=/home/ma"]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    spec = load_spec(out)
    assert spec.verl["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 4
    assert spec.verl["data.train_batch_size"] == 16 and spec.cluster.nnodes == 1
    assert str(spec.model.bf16) == "/home/ma/models/Qwen2.5-7B" and str(spec.data.train) == "/data/gsm8k/train.parquet"
    assert spec.env == {"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}  # what --env gives is the nodes', not carried
    assert f"{script}:4: read: the if at line 4 takes the branch of line 4" in err
    assert main(["import", str(script), "-o", str(out), "--env", "DEVICE=gpu0", "--env", "SIZE=32b"]) == 0
    spec = load_spec(out)
    assert spec.verl["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2
    assert spec.verl["data.train_batch_size"] == 8 and "env" not in out.read_text().split("verl:")[0]
    assert "$HOME/models" in str(spec.model.bf16)  # not given: named, never rollout8's own $HOME


def test_an_undecided_test_is_named_and_none_of_its_branches_is_read(tmp_path, capsys):
    script, out = choosing(tmp_path), tmp_path / "spec.yaml"
    (tmp_path / "run.sh").write_text(CHOOSING.replace('"$DEVICE" = "npu"', "-f /usr/local/Ascend/driver/version"))
    assert main(["import", str(script), "-o", str(out), "--env", "SIZE=7B"]) == 1
    err = capsys.readouterr().err
    assert f"{script}:4: not decided: the if (lines 4-10) depends on the file test -f /usr/local/Ascend/driver/" \
           "version" in err
    assert "$TP is not set" in err and "ASCEND_RT_VISIBLE_DEVICES" not in out.read_text()


def test_env_file_seeds_the_environment_as_a_user_exports_it(tmp_path, capsys):
    script, out = choosing(tmp_path), tmp_path / "spec.yaml"
    env_file = write(tmp_path, {"cluster.env": "# the cluster\nexport DEVICE=npu\nSIZE='32b'   # quoted\n"
                                               'export HOME="/home/ma"\nMODEL_PATH=$HOME/m\n'})
    assert main(["import", str(script), "-o", str(out), "--env-file", str(env_file), "--env", "SIZE=7B"]) == 0, \
        capsys.readouterr().err
    spec = load_spec(out)
    assert spec.verl["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 4
    assert spec.verl["data.train_batch_size"] == 16 and str(spec.model.bf16) == "/home/ma/m"  # --env wins
    env_file.write_text("DEVICE=npu\nrm -rf /\n")
    capsys.readouterr()
    assert main(["import", str(script), "--env-file", str(env_file)]) == 2
    assert f"{env_file}:2: not a KEY=VALUE line: rm -rf /" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "what"), [
    ("torchrun --standalone --nnodes=1 --nproc_per_node=8 \\\n  -m verl.trainer.fsdp_sft_trainer data.x=1\n",
     "an SFT launch (torchrun -m verl.trainer.fsdp_sft_trainer) at {script}:1, not an RL launch"),
    ("python3 -m verl.trainer.fsdp_sft_trainer data.x=1\n",
     "an SFT launch (python3 -m verl.trainer.fsdp_sft_trainer) at {script}:1, not an RL launch"),
    ("ray stop\nray start --head --port=6379\n", "only Ray cluster helpers (ray stop, ray start), no training"),
    # verl's DAPO recipe (recipe/dapo/run_dapo_*_npu.sh) is RL, but its own trainer and config: named as such
    ("ray job submit --no-wait -- python3 -m recipe.dapo.main_dapo data.x=1\n",
     "a verl recipe's own trainer (python3 -m recipe.dapo.main_dapo) at {script}:1: rollout8 launches the GRPO/PPO"),
])
def test_a_script_that_is_not_an_rl_launch_is_refused_in_one_line(text, what, tmp_path, capsys):
    script = write(tmp_path, {"run.sh": text})
    assert main(["import", str(script)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert what.format(script=script) in err and "verl.trainer.main_ppo" in err


@pytest.mark.parametrize(("module", "why"), [
    ("recipe.dapo.main_dapo", "RayDAPOTrainer.fit generates only through the async rollout manager"),
    ("recipe.one_step_off_policy.main_ppo", "rollout workers of its own"),
    ("recipe.r1_ascend.main_ppo", "patched copies of vLLM v0.9.1"),
    ("recipe.transfer_queue.main_ppo", "TransferQueue package"),
    ("recipe.gspo.main_gspo", None),  # a recipe trainer with no reason of its own: the common one alone
])
def test_a_recipe_trainer_is_refused_saying_why_it_cannot_run_under_rollout8(module, why, tmp_path, capsys):
    """No recipe runs in rollout8's image (verl's wheel has no `recipe` package; tests/image pins that), and each
    recipe trainer of the corpus has a reason of its own on top (docs/import-corpus.md, "Recipe trainers")."""
    script = write(tmp_path, {"run.sh": f"python3 -m {module} data.x=1\n"})
    assert main(["import", str(script)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"a verl recipe's own trainer (python3 -m {module}) at {script}:1" in err
    assert "rollout8's image has no `recipe` package" in err
    assert (why in err) if why else "; and " not in err


def test_an_sglang_rollout_is_refused_naming_its_line(tmp_path, capsys):
    script = write(tmp_path, {"run.sh": VERL_EXAMPLE.replace("rollout.name=vllm", "rollout.name=sglang")})
    assert main(["import", str(script)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{script}:17: actor_rollout_ref.rollout.name=sglang: rollout8 runs vLLM" in err
