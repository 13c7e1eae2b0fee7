"""One engine process of the engine tier: `python engine_worker.py SPEC.json`.

The tests start this in a fresh interpreter (FlashRL patches vLLM at import time, and a process holds one
engine), with the environment from engine_platform.engine_env(). It imports flash_rl the way verl's patched
`verl/__init__.py` does (first), builds `vllm.LLM(model=<bf16 dir>)` exactly as verl's sync rollout would, and
runs the steps the spec lists, recording each step's outcome in OUT/results.json (rewritten after every step,
so a crash leaves what happened before it) and tensors in OUT/<label>.pt.

Steps: generate:<label> | dump:<label> | reload:<label> (bf16 checkpoint weights through model.load_weights) |
       reload-perturbed:<label> (a simulated RL update, written to OUT/perturbed.pt first) |
       reload-default-device:<label> (the reload with the process default device set elsewhere: see below) |
       time-reload:<label> (a reload, no dump) | setenv:NAME=VALUE |
       sampler:stock|flashrl (vLLM's own Sampler.forward, or FlashRL 1.0.3's replacement of it, for what follows) |
       sample:<label> (generate with spec["samples"][label]: temperature, seed, penalties; tokens and log-probs)
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PROMPT_TOKEN_IDS = [[3, 17, 42, 99, 7, 12], [5, 8, 13, 21, 34]]
GENERATE_TOKENS = 8
SAMPLE_TOKENS = 24


def checkpoint_weights(model_dir: Path):
    from safetensors.torch import load_file

    for shard in sorted(model_dir.glob("*.safetensors")):
        yield from load_file(str(shard)).items()


def perturbed(model_dir: Path, seed: int, rel_noise: float, grow_rows: int, grow_factor: float) -> dict:
    """bf16 weights after a simulated RL update: relative Gaussian noise on every linear weight, and a few
    rows of each linear weight scaled up (weights that grow past the frozen int8 scales saturate)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, w in checkpoint_weights(model_dir):
        if name.endswith("proj.weight"):
            w32 = w.float()
            w32 = w32 + rel_noise * w32.std() * torch.randn(w32.shape, generator=g)
            w32[:grow_rows] *= grow_factor
            w = w32.to(w.dtype)
        out[name] = w
    return out


def find_model(llm):
    """The vLLM model module, at the path FlashRL 1.0.3 uses (vllm_patch.vllm_model_finder)."""
    engine = llm.llm_engine
    if not hasattr(engine, "model_executor"):
        engine.model_executor = engine.engine_core.model_executor
    return engine.model_executor.driver_worker.worker.model_runner.model


def verl_sync_rollout(model_dir: Path):
    """verl's sync vLLMRollout (verl 0.6.1), built as verl's rollout worker builds it: TP 1, inside the
    torch.distributed world the worker joined, on a (dp, infer_tp) device mesh. Sleep mode (free_cache_engine)
    is off: vLLM supports it on CUDA only (vllm-ascend brings its own)."""
    import torch
    from engine_platform import device_name, llm_kwargs
    from torch.distributed.device_mesh import init_device_mesh
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.vllm_rollout.vllm_rollout_spmd import vLLMRollout

    kwargs = llm_kwargs()
    world = torch.distributed.get_world_size()
    mesh = init_device_mesh(device_name(), (world, 1), mesh_dim_names=("dp", "infer_tp"))
    config = RolloutConfig(name="vllm", mode="sync", prompt_length=32, response_length=16, free_cache_engine=False,
                           enforce_eager=True, dtype=kwargs["dtype"], gpu_memory_utilization=0.3,
                           max_num_seqs=kwargs["max_num_seqs"], max_num_batched_tokens=256, load_format="auto",
                           tensor_model_parallel_size=1)
    return vLLMRollout(config, HFModelConfig(path=str(model_dir)), mesh)


def describe(model) -> dict:
    layer = model.model.layers[0]
    qkv = layer.self_attn.qkv_proj
    scheme = getattr(qkv, "scheme", None)
    return {
        "model_class": type(model).__name__,
        "qkv_quant_method": type(qkv.quant_method).__name__,
        "qkv_scheme": type(scheme).__name__ if scheme is not None else None,
        "qkv_weight_dtype": str(qkv.weight.dtype),
        "qkv_weight_shape": list(qkv.weight.shape),
        "param_devices": sorted({str(p.device) for p in model.parameters()}),
        "lm_head_dtype": str(model.lm_head.weight.dtype) if hasattr(model, "lm_head") else None,
        "has_flashrl_load_weights": hasattr(model, "beforeflashrl_load_weights"),
    }


def gc_audit(model, sync, replacing: bool = False) -> dict:
    """Run one sync while counting the process's full (generation 2) collections, then list what the sync left
    to the cycle collector (gc.DEBUG_SAVEALL keeps it for inspection): tensors there are buffers that only a full
    collection would free. With `replacing`, the sync's post-load step also re-registers one parameter whose old
    object is in a reference cycle, the case in which FlashRL's collection is needed (patches/flash_rl/0006)."""
    import gc

    import torch
    from vllm.model_executor.model_loader import utils as loader_utils

    full = []

    def count(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    original_postload = loader_utils.process_weights_after_loading
    if replacing:
        def postload_replacing(target, *args, **kwargs):
            result = original_postload(target, *args, **kwargs)
            # not the model's last parameter: FlashRL's hook keeps that one in a local until it returns
            norm = target.model.layers[0].input_layernorm
            old = norm.weight
            old.rollout8_cycle = old  # the old object keeps itself alive until a full collection
            norm.weight = torch.nn.Parameter(old.data, requires_grad=False)
            return result
        loader_utils.process_weights_after_loading = postload_replacing
    gc.collect()  # start from a clean heap: what is found afterwards is this sync's
    gc.callbacks.append(count)
    try:
        info = sync()
    finally:
        gc.callbacks.remove(count)
        loader_utils.process_weights_after_loading = original_postload
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
        left_bytes = sum(t.untyped_storage().nbytes() for t in left)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return {**info, "full_collections": len(full), "left_tensors": len(left), "left_bytes": left_bytes}


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"spec": spec, "steps": {}, "env": {k: v for k, v in os.environ.items()
                                                       if k.startswith(("FLASHRL", "VLLM", "RANK", "ROLLOUT8"))}}

    def save():
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str))

    def record(label, **fields):
        results["steps"][label] = fields
        save()

    t0 = time.time()
    # FLASHRL_CONFIG_AFTER_IMPORT: the trap. verl imports flash_rl (and so patches vLLM) at `import verl`; if the
    # variable reaches the process only afterwards, the patch never happened.
    late_config = os.environ.pop("FLASHRL_CONFIG_AFTER_IMPORT", None)
    via_verl = spec.get("verl_rollout", False)
    if via_verl:
        import verl  # our patched verl/__init__.py imports flash_rl first (patches/verl)

        results["verl_file"] = verl.__file__
    import flash_rl  # noqa: F401  (first, as the patched verl/__init__.py does)

    if late_config:
        os.environ["FLASHRL_CONFIG"] = late_config
    import torch
    import vllm
    from engine_platform import device_name, llm_kwargs, prepare_engine_process

    results["prepared"] = prepare_engine_process()
    results["flash_rl_file"] = flash_rl.__file__
    results["vllm_version"] = vllm.__version__
    device = torch.device(device_name())
    if spec.get("init_process_group"):
        # verl's rollout workers are already one torch.distributed world (the trainer's) when they build vllm.LLM;
        # the external_launcher executor then runs each DP rank's engine inside it.
        torch.distributed.init_process_group(backend="gloo", init_method="env://")
    bf16_dir = Path(spec["model"])
    rollout = None
    try:
        if via_verl:
            rollout = verl_sync_rollout(bf16_dir)
            llm = rollout.inference_engine
        else:
            llm = vllm.LLM(model=str(bf16_dir), **llm_kwargs(), **spec.get("llm_kwargs", {}))
    except Exception as exc:  # recorded: some scenarios expect the engine not to come up
        record("start", ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
        return 0
    model = find_model(llm)
    record("start", ok=True, seconds=round(time.time() - t0, 1),
           served_model=llm.llm_engine.model_config.model,
           quantization=llm.llm_engine.model_config.quantization, **describe(model))

    def dump(label):
        torch.save({n: p.detach().to("cpu").clone() for n, p in model.named_parameters()}, out / f"{label}.pt")

    def reload(weights):
        start = time.time()
        on_device = ((n, t.to(device)) for n, t in weights)
        if rollout is not None:  # verl's own weight-sync entry point (it calls model.load_weights)
            import asyncio

            asyncio.run(rollout.update_weights(on_device))
            return {"seconds": round(time.time() - start, 3), "updated": None}
        updated = model.load_weights(on_device)
        return {"seconds": round(time.time() - start, 3), "updated": len(updated) if updated is not None else None}

    from vllm.v1.sample.sampler import Sampler

    flashrl_forward = Sampler.forward  # FlashRL's replacement when FlashRL patched this engine (else vLLM's own)

    in_memory: dict = {}
    for step in spec["steps"]:
        kind, _, label = step.partition(":")
        label = label or kind
        try:
            if kind == "generate":
                params = vllm.SamplingParams(temperature=0.0, max_tokens=GENERATE_TOKENS, ignore_eos=True, logprobs=0)
                prompts = [{"prompt_token_ids": ids} for ids in PROMPT_TOKEN_IDS]
                outs = llm.generate(prompts, params, use_tqdm=False)
                record(label, ok=True, tokens=[list(o.outputs[0].token_ids) for o in outs],
                       logprobs=[[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids,
                                                                 strict=True)] for o in outs])
            elif kind == "sampler":
                from vllm.v1.sample.sampler import Sampler

                assert hasattr(Sampler, "beforeflashrl_forward"), "FlashRL did not replace the sampler in this engine"
                if label == "stock":
                    Sampler.forward = Sampler.beforeflashrl_forward
                else:
                    Sampler.forward = flashrl_forward
                record(f"sampler:{label}", ok=True)
            elif kind == "sample":
                params = vllm.SamplingParams(max_tokens=SAMPLE_TOKENS, ignore_eos=True, logprobs=0,
                                             **spec["samples"][label])
                outs = llm.generate([{"prompt_token_ids": ids} for ids in PROMPT_TOKEN_IDS], params, use_tqdm=False)
                record(label, ok=True, params=spec["samples"][label],
                       sampler="flashrl" if Sampler.forward is flashrl_forward else "stock",
                       prompts=PROMPT_TOKEN_IDS, tokens=[list(o.outputs[0].token_ids) for o in outs],
                       logprobs=[[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids,
                                                                 strict=True)] for o in outs])
            elif kind == "setenv":
                key, _, value = label.partition("=")
                os.environ[key] = value
                record(label, ok=True)
            elif kind == "dump":
                dump(label)
                record(label, ok=True)
            elif kind == "reload":
                info = reload(checkpoint_weights(bf16_dir))
                dump(label)
                record(label, ok=True, **info, **describe(model))
            elif kind == "time-reload":  # a reload from weights held in memory, no dump (benchmarks)
                if "bf16" not in in_memory:
                    in_memory["bf16"] = dict(checkpoint_weights(bf16_dir))
                record(label, ok=True, **reload(in_memory["bf16"].items()))
            elif kind in ("reload-gc-audit", "reload-gc-audit-replacing"):
                record(label, ok=True, **gc_audit(model, lambda: reload(checkpoint_weights(bf16_dir)),
                                                  replacing=kind.endswith("replacing")))
                dump(label)
            elif kind == "reload-perturbed":
                weights = perturbed(bf16_dir, **spec["perturb"])
                torch.save(weights, out / "perturbed.pt")
                info = reload(weights.items())
                dump(label)
                record(label, ok=True, **info)
            elif kind == "reload-default-device":
                # On an accelerator the process default device is the host while the rollout weights live on
                # the device. A CPU has one device, so the "elsewhere" default is the meta device here: a
                # buffer allocated without naming the parameter's device lands there and the reload breaks.
                torch.set_default_device("meta")
                try:
                    info = reload(checkpoint_weights(bf16_dir))
                finally:
                    torch.set_default_device(None)
                dump(label)
                record(label, ok=True, **info, **describe(model))
            else:
                raise ValueError(f"unknown step {step!r}")
        except Exception as exc:
            record(label, ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
            if not spec.get("continue_on_error", False):
                break
    results["seconds"] = round(time.time() - t0, 1)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
