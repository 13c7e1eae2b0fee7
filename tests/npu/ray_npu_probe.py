"""The ray-npu step's job: `ray job submit ... -- python ray_npu_probe.py` against the node's running Ray.

It prints one probe line from the job's entrypoint (where Ray 2.46's job supervisor may leave the NPUs hidden:
ray #59063) and one from a Ray task that requests `NPU` (where the raylet's environment, and so the no-set flag
exported before `ray start`, applies). rollout8.node.accept_npu.check_ray_npu judges them.
"""

from __future__ import annotations

import json
import os

MARK = "ROLLOUT8_NPU_PROBE "  # rollout8.node.accept_npu.PROBE_MARK (this file runs where rollout8 may not be)
TASK_TIMEOUT_S = float(os.environ.get("ROLLOUT8_ACCEPT_RAY_TASK_TIMEOUT", "180"))


def probe(where: str) -> dict:
    facts = {"where": where, "visible": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"),
             "noset": os.environ.get("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES")}
    try:
        import torch
        import torch_npu  # noqa: F401

        facts.update(available=bool(torch.npu.is_available()), count=int(torch.npu.device_count()))
    except Exception as exc:  # noqa: BLE001 - reported in the probe
        facts.update(available=False, count=0, error=f"{type(exc).__name__}: {exc}")
    return facts


def main() -> None:
    print(MARK + json.dumps(probe("entrypoint")), flush=True)
    import ray

    ray.init()  # the job's own cluster (the supervisor sets RAY_ADDRESS)
    task = ray.remote(resources={"NPU": 1})(probe).remote("task")
    try:
        facts = ray.get(task, timeout=TASK_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        facts = {"where": "task", "error": f"not scheduled within {TASK_TIMEOUT_S:.0f} s: no node offers a free "
                                           f"NPU resource"}
    except Exception as exc:  # noqa: BLE001
        facts = {"where": "task", "error": f"{type(exc).__name__}: {exc}"}
    print(MARK + json.dumps(facts), flush=True)


if __name__ == "__main__":
    main()
