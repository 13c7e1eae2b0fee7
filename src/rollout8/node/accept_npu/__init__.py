"""The NPU acceptance suite's logic that needs no NPU: facts in, PASS/FAIL lines out.

`tests/npu/` (marker `npu`, `make accept-npu`) is what a user runs on the first real node before any training.
Its steps, each one PASS/FAIL line:
  environment  npu-smi lists healthy NPUs; CANN and torch_npu match versions.lock.yaml; the driver version is
               shown; torch_npu sees the NPUs; vllm_ascend_C (vllm-ascend's compiled ops) loads
  loading      the converted int8 model loads in vllm.LLM through FlashRL's patched path and generates text
  reload       one FlashRL weight update from the bf16 model, generation again, and the int8 weights in the
               engine equal what verify-quant's arithmetic (rollout8.quant.quantmath) predicts, within 1 LSB
  logs         `rollout8 logs` on FlashRL's log: verdict green
  speed        tokens/s of the int8 engine and of the bf16 engine on the same prompts, side by side
  cann-pairing torch_npu imports in a fresh process on this CANN (an undefined symbol in libtbe_adapter.so means
               CANN and torch_npu are not a working pair: Ascend/pytorch #99)
  ray-npu      torch.npu.is_available() inside a `ray job submit` entrypoint and inside a Ray task that requests
               `NPU` (Ray 2.46's job supervisor does not set the Ascend no-set flag: ray #59063)
  weight-sync  one FlashRL weight sync of a 7B-shaped model, in seconds and GB/s, with the share spent in
               vllm-ascend's post-load transpose/NZ step that FlashRL re-runs at every sync (SkyRL #176)
  hccl         with two nodes: an HCCL broadcast and all-reduce of a tensor as large as the model's largest
               weight (verl PR #6834's large-tensor broadcast bug); HCCL error codes mapped to their usual cause
               (node/hccl_codes.py). Skipped, with how to give the second node, when only one is given.
Gathering the facts happens on the node (tests/npu); evaluating them happens here, and is tested on CPU
(tests/unit/test_accept_npu.py). The modules, by responsibility:
  facts    what the node reports and how to read it (npu-smi, version files, probe lines, ROLLOUT8_ACCEPT_*)
  weights  the int8 weights the engine should hold after a reload (vLLM's fused names, orientation, LSB distance)
  checks   the judgement of each step: facts in, one StepResult out
  report   the PASS/FAIL/SKIP lines and the verdict (their text is read by the accept_npu Ansible role)
  runner   `python -m rollout8.node.accept_npu` (scripts/accept-npu.sh): can the suite run on this machine?
The names below are re-exported here: callers import `rollout8.node.accept_npu`, not its modules.
"""

from __future__ import annotations

from ..npu_visibility import NOSET
from .checks import (
    ONE_NODE,
    POST_LOAD_DOMINANT,
    check_cann_pairing,
    check_environment,
    check_hccl,
    check_loading,
    check_logs,
    check_ray_npu,
    check_reload,
    check_speed,
    check_weight_sync,
    classify_import_failure,
    gbps,
    same_python_release,
    same_release,
    speed_table,
)
from .facts import (
    DEFAULT_RAY_JOB_API,
    HCCL_MASTER,
    HCCL_RANK,
    HCCL_WORLD,
    IMPORT_PROBE,
    MIN_SYNC_GBPS,
    NO_RAY,
    PROBE_MARK,
    EnvFacts,
    HcclPlan,
    ImportProbe,
    NpuSmi,
    SpeedRun,
    SyncTiming,
    cann_version_files,
    generated_pair_bytes,
    hccl_plan,
    largest_weight,
    min_sync_gbps,
    parse_npu_smi,
    parse_probes,
    ray_job_address,
    read_version_file,
    room_problem,
)
from .report import (
    FAIL,
    PASS,
    SKIP,
    STEPS,
    StepResult,
    format_report,
    result,
)
from .runner import (
    NEEDS_NPU,
    main,
    npu_absent_reason,
)
from .weights import (
    FUSED,
    MAX_LSB,
    ND_FORMAT,
    NZ_FORMAT,
    WeightComparison,
    compare_engine_int8,
    detect_orientation,
    expected_fused,
)

__all__ = [
    "cann_version_files", "check_cann_pairing", "check_environment", "check_hccl", "check_loading", "check_logs",
    "check_ray_npu", "check_reload", "check_speed", "check_weight_sync", "classify_import_failure",
    "compare_engine_int8", "DEFAULT_RAY_JOB_API", "detect_orientation", "EnvFacts", "expected_fused", "FAIL",
    "format_report", "FUSED", "gbps", "generated_pair_bytes", "HCCL_MASTER", "hccl_plan", "HCCL_RANK", "HCCL_WORLD",
    "HcclPlan", "IMPORT_PROBE", "ImportProbe", "largest_weight", "main", "MAX_LSB", "MIN_SYNC_GBPS", "min_sync_gbps",
    "ND_FORMAT", "NEEDS_NPU", "NO_RAY", "NOSET", "npu_absent_reason", "NpuSmi", "NZ_FORMAT", "ONE_NODE",
    "parse_npu_smi", "parse_probes", "PASS", "POST_LOAD_DOMINANT", "PROBE_MARK", "ray_job_address", "read_version_file",
    "result", "room_problem", "same_python_release", "same_release", "SKIP", "speed_table", "SpeedRun", "StepResult",
    "STEPS", "SyncTiming", "WeightComparison",
]
