"""Each CPU bridge of virtual/cpu_bridges/rollout8_cpu_bridges.py, shown necessary and sufficient.

Every test runs the upstream code (torch, verl 0.6.1, vLLM, Ray at our pins) twice in a fresh interpreter of the
engine venv: without the bridge it must fail the way stack-facts records for the real verl run on CPU, with
only that bridge installed it must pass. A bridge that stops being needed (upstream fixed it) fails here too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from engine_runs import VERL_OVERLAY, rollout8

REPO = Path(__file__).resolve().parents[2]
BRIDGES_DIR = REPO / "virtual" / "cpu_bridges"
if not BRIDGES_DIR.is_dir():  # the training image carries tests/engine but, by design, no CPU bridges
    pytest.skip("virtual/cpu_bridges is not here (only the simulated tier has it)", allow_module_level=True)


def run(code: str, bridge: str | None, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`code` in a new engine-venv interpreter, after `install((bridge,))` when a bridge is named (a name that is
    no bridge, such as "env-only", installs only the environment of ENV)."""
    prelude = f"import rollout8_cpu_bridges as b; print('APPLIED', b.install(({bridge!r},)))\n" if bridge else ""
    path = [str(BRIDGES_DIR), str(REPO / "virtual" / "engine"), str(VERL_OVERLAY)]
    # CUDA_VISIBLE_DEVICES="" as Ray gives CPU actors; a None value in env unsets a variable
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), CUDA_VISIBLE_DEVICES="")
    full_env.pop("ROLLOUT8_CPU_SYNC_DIAG", None)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def fails_then_passes(code: str, bridge: str, error: str, **kwargs) -> None:
    without = run(code, None, **kwargs)
    assert without.returncode != 0 and error in without.stderr, \
        f"upstream no longer fails without {bridge}: rc {without.returncode}\n{without.stderr[-2000:]}"
    with_bridge = run(code, bridge, **kwargs)
    assert with_bridge.returncode == 0, with_bridge.stderr[-3000:]
    assert "PASS" in with_bridge.stdout, with_bridge.stdout[-2000:]


WORLD_OF_ONE = """
import os, tempfile, torch, torch.distributed as dist
store = dist.FileStore(tempfile.mktemp(), 1)
"""


def test_gloo_backend_string():
    fails_then_passes(WORLD_OF_ONE + """
from verl.utils.device import get_device_name, get_nccl_backend
dist.init_process_group(backend=f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}", store=store, rank=0, world_size=1)
print("PASS", dist.get_backend())
""", "gloo_backend+collectives", "Duplicate device type cpu")


def test_gloo_avg_all_reduce():
    fails_then_passes(WORLD_OF_ONE + """
dist.init_process_group(backend="cpu:gloo", store=store, rank=0, world_size=1)
from verl.utils.profiler.performance import reduce_timing
out = reduce_timing({"gen": 2.0, "step": 3.0})
assert out == {"gen": 2.0, "step": 3.0}, out
print("PASS", out)
""", "gloo_backend+collectives", "Cannot use ReduceOp.AVG with Gloo")


def test_gloo_zero_dim_all_gather():
    fails_then_passes(WORLD_OF_ONE + """
dist.init_process_group(backend="cpu:gloo", store=store, rank=0, world_size=1)
x = torch.tensor(3.5)
out = [torch.zeros(1)]
dist.all_gather(out, x)
assert out[0].item() == 3.5
print("PASS")
""", "gloo_backend+collectives", "invalid tensor size")


def test_fsdp_sync_module_states_on_cpu():
    fails_then_passes(WORLD_OF_ONE + """
dist.init_process_group(backend="cpu:gloo", store=store, rank=0, world_size=1)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = FSDP(torch.nn.Linear(4, 4), sync_module_states=True, device_id=torch.device("cpu"))
print("PASS", type(model).__name__)
""", "fsdp_module_states", "CPU parameters or buffers when `sync_module_states=True`")


def test_torch_cpu_device_functions():
    fails_then_passes("""
from verl.utils.device import get_torch_device
device = get_torch_device()
state = device.get_rng_state()
device.set_rng_state(state)
device.manual_seed(0)
device.empty_cache()
assert device.max_memory_allocated() == 0 and device.memory_reserved() == 0
free, total = device.mem_get_info()
assert 0 < free <= total
print("PASS", device.__name__)
""", "torch_cpu_device", "has no attribute 'get_rng_state'")


def test_vllm_triton_off_under_rays_empty_cuda_visible_devices():
    fails_then_passes("""
from vllm.triton_utils import HAS_TRITON, triton
assert not HAS_TRITON, "triton kept on with 0 drivers"
print("PASS")
""", "vllm_triton", "triton kept on with 0 drivers")


def test_vllm_cpu_int8_ops_in_the_process():
    fails_then_passes("""
import torch
import vllm._custom_ops as ops
x = torch.randn(3, 8)
q, scale, _ = ops.scaled_int8_quant(x)
assert q.dtype == torch.int8 and scale.shape[0] == 3
print("PASS")
""", "vllm_int8_ops", "dynamic_scaled_int8_quant")


def test_ray_bundles_reserve_the_npu_resource():
    fails_then_passes("""
import ray, shutil, tempfile
temp = tempfile.mkdtemp(prefix="r8ray-", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
ray.init(num_cpus=2, resources={"NPU": 1}, include_dashboard=False, _temp_dir=temp, logging_level="ERROR")
import os, threading
from verl.single_controller.ray.base import RayResourcePool
got = []  # verl blocks until its placement groups are ready: a bundle no node can hold waits forever
worker = threading.Thread(target=lambda: got.extend(
    RayResourcePool([1], use_gpu=True, max_colocate_count=1).get_placement_groups(device_name="cpu")), daemon=True)
worker.start()
worker.join(60)
if not got:
    import sys
    print("placement group never ready", file=sys.stderr, flush=True)
    ray.shutdown()
    os._exit(3)
pg = got[0]
print("PASS", pg.bundle_specs)
ray.shutdown()
shutil.rmtree(temp, ignore_errors=True)
""", "ray_bundles", "placement group never ready")


def test_verl_local_rank_under_the_ascend_noset_flag():
    """The nodes export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1 before `ray start` (as an Atlas node
    must); verl then indexes Ray's GPU ids, empty on a CPU node, in every worker it builds."""
    fails_then_passes("""
import ray, shutil, tempfile
temp = tempfile.mkdtemp(prefix="r8ray-", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
ray.init(num_cpus=1, resources={"NPU": 1}, include_dashboard=False, _temp_dir=temp, logging_level="ERROR")
from verl.single_controller.base.worker import Worker
from verl.utils.ray_utils import ray_noset_visible_devices
try:
    Worker._setup_env_cuda_visible_devices(None)  # what every verl worker runs first
finally:
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
print("PASS", ray_noset_visible_devices())
""", "ray_noset_ascend", "IndexError", env={"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"})


def test_verl_worker_config_turns_off_what_a_cpu_lacks(tmp_path):
    """Upstream refuses both settings on CPU; the bridge sets both in the worker's config before verl reads it."""
    model = tmp_path / "tiny"
    rollout8("make-test-model", "--preset", "tiny-engine", "-o", str(model))
    refused = run(f"""
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained({str(model / 'bf16')!r}, attn_implementation="flash_attention_2")
""", None)
    assert refused.returncode != 0 and "FlashAttention2" in refused.stderr, refused.stderr[-2000:]
    sleep = run("""
from vllm.config import ModelConfig
from vllm.platforms import current_platform
assert not current_platform.is_sleep_mode_available(), "sleep mode available"
""", None)
    assert sleep.returncode == 0, sleep.stderr[-2000:]
    fails_then_passes("""
from omegaconf import OmegaConf
import verl.workers.fsdp_workers as w
seen = {}
def capture(self, config, role, **kwargs):
    seen["attn"] = config.model.override_config.attn_implementation
    seen["free"] = config.rollout.free_cache_engine
w.ActorRolloutRefWorker.__init__ = capture
import rollout8_cpu_bridges as b
if "verl_worker_config" in b.APPLIED:  # the bridge wrapped the original; wrap the capture instead
    b.verl_worker_config(w)
config = OmegaConf.create({"model": {"override_config": {}}, "rollout": {"free_cache_engine": True}})
w.ActorRolloutRefWorker.__init__(object.__new__(w.ActorRolloutRefWorker), config, "actor_rollout")
assert seen == {"attn": "eager", "free": False}, seen
print("PASS", seen)
""", "verl_worker_config", "ConfigAttributeError")


def test_install_only_touches_what_it_names():
    """install() adds the environment and the import hook; nothing else is imported by it."""
    probe = run("""
import sys
import rollout8_cpu_bridges as b
b.install()
heavy = [m for m in ("torch", "vllm", "verl", "ray") if m in sys.modules]
assert not heavy, heavy
import os
assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
print("PASS")
""", None)
    assert probe.returncode == 0 and "PASS" in probe.stdout, probe.stderr[-2000:]


@pytest.mark.parametrize("backend, expected", [("cpu:gloo,cpu:nccl", "cpu:gloo"), ("nccl", "gloo"),
                                               ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:gloo"), ("gloo", "gloo")])
def test_cpu_backend_string(backend, expected):
    import rollout8_cpu_bridges  # virtual/cpu_bridges, on pytest's pythonpath

    assert rollout8_cpu_bridges.cpu_backend(backend) == expected


def test_vllm_cpu_threads_bind_for_every_rank():
    fails_then_passes("""
import os
os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "all"  # what a single-engine setup uses
from vllm.v1.worker.cpu_worker import CPUWorker
worker = object.__new__(CPUWorker)
worker.rank = 2  # the third node's rollout rank
try:
    worker.init_device()
except IndexError:
    raise
except Exception:  # past the binding: the half-built worker stops at its next attribute
    pass
assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "all|all|all", os.environ["VLLM_CPU_OMP_THREADS_BIND"]
print("PASS")
""", "vllm_cpu_threads", "IndexError",
                      env={"ROLLOUT8_CPU_BRIDGES_SET_THREADS_BIND": "1", "CUDA_VISIBLE_DEVICES": None})


def test_torch_compile_runs_eager_on_nodes_without_a_compiler():
    """The nodes have no C++ compiler (like the simulated ones): inductor fails at the first compiled call
    (vLLM's CPU compilation, verl's compiled entropy) unless the bridges' TORCHDYNAMO_DISABLE makes it eager."""
    fails_then_passes("""
import torch
f = torch.compile(lambda x: torch.nn.functional.silu(x) * 2)
assert torch.allclose(f(torch.ones(4)), torch.nn.functional.silu(torch.ones(4)) * 2)
print("PASS")
""", "env-only", "BackendCompilerFailed", env={"CXX": "/nonexistent/g++", "CC": "/nonexistent/gcc",
                                               "TORCHINDUCTOR_CACHE_DIR": "/tmp/r8-no-inductor-cache"})


def test_vllm_sleep_mode_off_on_the_cpu_platform(tmp_path):
    """verl's async vLLMHttpServer hardcodes enable_sleep_mode=True, which vLLM's CPU platform refuses."""
    model = tmp_path / "tiny"
    rollout8("make-test-model", "--preset", "tiny-engine", "-o", str(model))
    fails_then_passes(f"""
from vllm.engine.arg_utils import EngineArgs
config = EngineArgs(model={str(model / 'bf16')!r}, enable_sleep_mode=True).create_model_config()
assert not config.enable_sleep_mode
print("PASS")
""", "vllm_sleep_mode", "Sleep mode is not supported", env={"CUDA_VISIBLE_DEVICES": None})
