"""FlashRL's fixes after 1.0.3 that apply at our pins, backported as patches/flash_rl (checked against this vLLM).

- 0005 (FlashRL commit 4eefac8, PR #35): `load_column_parallel_weight` among the loaders FlashRL records at engine
  start and re-attaches at every sync. Which loaders it must record is vLLM's business: every `param.load_*` a
  linear layer's weight_loader_v2 calls on a parameter. The test reads them from this engine's vLLM source.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys

from engine_runs import UNPATCHED_OVERLAY

READ_KEYS = "import json, flash_rl.vllm_patch as v; print(json.dumps(v.recorded_loader_keys))"


def vllm_param_loaders() -> set[str]:
    """The parameter methods vLLM's linear layers load weights through (`param.load_...(`) at this vLLM."""
    import vllm.model_executor.layers.linear as linear

    return set(re.findall(r"\bparam\.(load_\w+)\(", inspect.getsource(linear)))


def recorded_keys(unpatched: bool) -> set[str]:
    env = dict(os.environ)
    if unpatched:
        env["PYTHONPATH"] = os.pathsep.join([str(UNPATCHED_OVERLAY), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-c", READ_KEYS], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_flashrl_records_every_loader_vllms_linear_layers_call():
    loaders = vllm_param_loaders()
    assert {"load_qkv_weight", "load_merged_column_weight", "load_row_parallel_weight"} <= loaders, loaders
    patched = recorded_keys(unpatched=False)
    assert loaders <= patched, f"FlashRL does not re-attach {sorted(loaders - patched)} at a weight sync"
    # the stock 1.0.3 wheel misses exactly the one FlashRL #35 added: what 0005 backports
    assert loaders - recorded_keys(unpatched=True) == {"load_column_parallel_weight"}
