"""One engine process of the NPU acceptance suite: `python npu_worker.py SPEC.json`.

A fresh interpreter per engine (FlashRL patches vLLM at import time; a process holds one engine). It imports
flash_rl first, as the patched verl/__init__.py does, then builds `vllm.LLM(model=<bf16 dir>)` the way verl's
sync rollout does; FlashRL's config (FLASHRL_CONFIG, written by `rollout8 setup`) swaps it to the int8 model.
Each step's outcome goes to OUT/results.json, rewritten after every step so a crash keeps what happened before.
It imports the engine harness (virtual/engine: engine_platform, engine_worker) from PYTHONPATH, which
npu_support.run_engine sets.

Steps: start | generate:<label> | reload:<label> (bf16 checkpoint through the model's load_weights, i.e. one
FlashRL weight update) | dump-int8:<label> (the engine's int8 weights read back in ND format, to OUT/<label>.pt)
| speed:<label> (timed greedy generation of `speed_prompts` prompts x `max_tokens` tokens, EOS ignored)
| sync:<label> (one timed weight sync as verl does it: the bf16 weights already on the device, then FlashRL's
patched load_weights, with the time spent inside the quant methods' process_weights_after_loading, i.e.
vllm-ascend's W8A8_DYNAMIC transpose + NZ cast that FlashRL re-runs at every sync, measured on its own, and
the same parts a job's `rollout8: sync` lines carry, from rollout8.node.sync_timing).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from pathlib import Path

PROMPTS = ["The capital of France is", "Natalia sold clips to 48 of her friends in April. How many",
           "def fibonacci(n):", "Int8 rollout on Ascend NPUs means"]


def read_back_nd(tensor):
    """An engine weight on the host in the ND layout (vllm-ascend keeps W8A8_DYNAMIC weights in NZ, format 29)."""
    fmt = None
    try:
        import torch_npu

        fmt = int(torch_npu.get_npu_format(tensor))
        if fmt != 2:
            tensor = torch_npu.npu_format_cast(tensor.clone(), 2)
    except ImportError:
        pass
    return tensor.detach().to("cpu").clone(), fmt


def synchronize(device) -> None:
    import torch

    backend = getattr(torch, device.type, None)
    if backend is not None and hasattr(backend, "synchronize"):
        backend.synchronize()


@contextlib.contextmanager
def time_post_load(model, device):
    """While active, the time spent in process_weights_after_loading of every quant method class in the model
    (device work included) adds up in the yielded dict; the classes are restored afterwards."""
    total = {"seconds": 0.0, "calls": 0}
    originals = {}
    for module in model.modules():
        cls = type(getattr(module, "quant_method", None))
        if cls in originals or not hasattr(cls, "process_weights_after_loading"):
            continue
        originals[cls] = cls.__dict__.get("process_weights_after_loading")
        inherited = cls.process_weights_after_loading

        def timed(self, layer, *args, _original=inherited, **kwargs):
            synchronize(device)
            start = time.time()
            try:
                return _original(self, layer, *args, **kwargs)
            finally:
                synchronize(device)
                total["seconds"] += time.time() - start
                total["calls"] += 1

        cls.process_weights_after_loading = timed
    try:
        yield total
    finally:
        for cls, own in originals.items():
            if own is None:
                del cls.process_weights_after_loading
            else:
                cls.process_weights_after_loading = own


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"spec": spec, "steps": {}}

    def save():
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str))

    def record(label, **fields):
        results["steps"][label] = fields
        save()

    import flash_rl  # noqa: F401  (first, as the patched verl/__init__.py does)
    import torch
    import vllm

    from rollout8.node import sync_timing

    sync_timing.install()  # before the engine: FlashRL asks for its quantize function at construction
    from engine_platform import device_name, llm_kwargs, prepare_engine_process
    from engine_worker import checkpoint_weights, describe, find_model

    results["prepared"] = prepare_engine_process()
    results["vllm_version"] = vllm.__version__
    device = torch.device(device_name())
    bf16_dir = Path(spec["model"])
    t0 = time.time()
    try:
        llm = vllm.LLM(model=str(bf16_dir), **llm_kwargs(), **spec.get("llm_kwargs", {}))
    except Exception as exc:
        record("start", ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
        return 0
    model = find_model(llm)
    record("start", ok=True, seconds=round(time.time() - t0, 1), served_model=llm.llm_engine.model_config.model,
           quantization=llm.llm_engine.model_config.quantization, **describe(model))
    max_tokens = int(spec.get("max_tokens", 32))

    for step in spec["steps"]:
        kind, _, label = step.partition(":")
        label = label or kind
        try:
            if kind == "generate":
                params = vllm.SamplingParams(temperature=0.0, max_tokens=16)
                outs = llm.generate(PROMPTS, params, use_tqdm=False)
                record(label, ok=True, texts=[o.outputs[0].text for o in outs])
            elif kind == "reload":
                start = time.time()
                updated = model.load_weights(((n, t.to(device)) for n, t in checkpoint_weights(bf16_dir)))
                record(label, ok=True, seconds=round(time.time() - start, 3),
                       updated=len(updated) if updated is not None else None)
            elif kind == "dump-int8":
                tensors, formats = {}, {}
                for name, p in model.named_parameters():
                    if p.dtype == torch.int8:
                        tensors[name], formats[name] = read_back_nd(p.data)
                torch.save(tensors, out / f"{label}.pt")
                record(label, ok=True, formats=formats, count=len(tensors))
            elif kind == "speed":
                n = int(spec.get("speed_prompts", 16))
                prompts = [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(n)]
                params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
                llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
                start = time.time()
                outs = llm.generate(prompts, params, use_tqdm=False)
                seconds = time.time() - start
                record(label, ok=True, prompts=n, tokens=sum(len(o.outputs[0].token_ids) for o in outs),
                       seconds=seconds)
            elif kind == "sync":
                weights = [(n, t.to(device)) for n, t in checkpoint_weights(bf16_dir)]  # as the actor holds them
                nbytes = sum(t.numel() * t.element_size() for _, t in weights)
                with time_post_load(model, device) as post:
                    synchronize(device)
                    start = time.time()
                    sync_timing.wrap_postload()  # FlashRL's post-load re-run, in place since the engine started
                    with sync_timing.measure() as timed, sync_timing.part("load"):
                        model.load_weights(sync_timing.timed_items(iter(weights), "gather", "bytes"))
                        synchronize(device)
                    seconds = time.time() - start
                record(label, ok=True, seconds=seconds, bytes=nbytes, parameters=sum(t.numel() for _, t in weights),
                       post_load_seconds=post["seconds"] if post["calls"] else None, post_load_calls=post["calls"],
                       parts={k: round(v, 4) for k, v in timed.seconds.items() if k != "switch"})
                del weights
            else:
                raise ValueError(f"unknown step {step!r}")
        except Exception as exc:
            record(label, ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
