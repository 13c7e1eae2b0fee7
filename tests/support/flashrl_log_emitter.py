"""Make FlashRL 1.0.3 write its real log lines, without vLLM, for the `rollout8 logs` tests.

Tests call emit(); it runs this file as a script in a subprocess (flash_rl configures the root logger at import):
    PYTHONPATH=STUB_DIR python flashrl_log_emitter.py PLAN.json
PLAN: {"flashrl_config": PATH or null, "ranks": [{"rank": R, "tp": T, "syncs": S, "file": F, "cuda_shim": true}]}

A minimal stand-in `vllm` package (an LLM class whose engine exposes a model with load_weights), first on the
child's PYTHONPATH (before site-packages: it shadows a real vllm); everything else is FlashRL's own code: its
import-time patching, the patched `vllm.LLM.__init__` (config detection, per-rank entry choice, load_weights
patch) and the quantizing load_weights that logs each sync. Each rank's lines go to its own file through FlashRL's
own handler and formatter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

STUB = '''
__version__ = "0.10.1"


class _Model:
    def load_weights(self, weights):
        return {name for name, _ in weights}


class _Runner:
    def __init__(self):
        self.model = _Model()


class _Worker:
    def __init__(self):
        self.model_runner = _Runner()


class _Driver:
    def __init__(self):
        self.worker = _Worker()


class _Executor:
    def __init__(self):
        self.driver_worker = _Driver()


class _Engine:
    def __init__(self):
        self.model_executor = _Executor()


class LLM:
    def __init__(self, model, **kwargs):
        self.model = model
        self.kwargs = kwargs
        self.llm_engine = _Engine()
'''


def write_stub(directory: Path) -> Path:
    pkg = directory / "vllm"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(STUB)
    (pkg / "envs.py").write_text("VLLM_USE_V1 = True\n")
    return directory


def emit(tmp: Path, config: Path | None, ranks: list[dict]) -> None:
    """Run FlashRL's patched vllm.LLM.__init__ (and `syncs` weight loads) once per rank, in one child process,
    against the stand-in vllm written under `tmp`; each rank logs to its own "file"."""
    stub = write_stub(tmp / "stub")
    plan = {"flashrl_config": str(config) if config else None, "ranks": ranks}
    (tmp / "plan.json").write_text(json.dumps(plan))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(stub), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, __file__, str(tmp / "plan.json")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    os.environ["FLASHRL_LOGGING_LEVEL"] = "DEBUG"
    os.environ.setdefault("WORLD_SIZE", str(max(r["rank"] for r in plan["ranks"]) + 1))
    if plan.get("flashrl_config"):
        os.environ["FLASHRL_CONFIG"] = plan["flashrl_config"]
    else:
        os.environ.pop("FLASHRL_CONFIG", None)
    import logging

    import torch

    real_current_device = torch.cuda.current_device
    first = plan["ranks"][0]
    streams = {first["file"]: open(first["file"], "a")}  # noqa: SIM115 (closed at the end)
    sys.stderr = streams[first["file"]]  # flash_rl's console handler binds sys.stderr at import
    import flash_rl  # noqa: F401  (the import is what patches vLLM)
    import vllm

    handler = next(h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler))
    for entry in plan["ranks"]:
        stream = streams.setdefault(entry["file"], open(entry["file"], "a"))  # noqa: SIM115
        handler.setStream(stream)
        sys.stderr = stream
        os.environ["RANK"] = str(entry["rank"])
        try:
            llm = vllm.LLM(model="/unused", tensor_parallel_size=entry.get("tp", 1),
                           distributed_executor_backend="external_launcher")
        except Exception as exc:  # FlashRL 1.0.3 crashes after "config not detected" (config_data unbound)
            print(f"Traceback (most recent call last):\n{type(exc).__name__}: {exc}", file=stream)
            continue
        model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        # On an NPU, torch_npu's transfer_to_npu answers torch.cuda.current_device(); without it FlashRL's
        # quantizer fails with "Torch not compiled with CUDA enabled" (stack-facts trap 4): "cuda_shim": false.
        torch.cuda.current_device = (lambda: "cpu") if entry.get("cuda_shim", True) else real_current_device
        try:
            for _ in range(entry.get("syncs", 0)):
                model.load_weights([("model.norm.weight", torch.ones(4))])
        except Exception:
            traceback.print_exc(file=stream)
        stream.flush()
    sys.stderr = sys.__stderr__
    handler.setStream(sys.__stderr__)
    for stream in streams.values():
        stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
