"""What the node reports, and how to read it: the facts tests/npu gathers for each step, the parsers of what
npu-smi, CANN's version files and the probes print, and the suite's settings from the environment
(ROLLOUT8_ACCEPT_*). Judging the facts is checks.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..npu_visibility import NOSET


# ------------------------------------------------------------------------------------------------ environment
@dataclass
class NpuSmi:
    version: str | None
    npus: list[tuple[int, str, str]]  # (id, name, health)


_SMI_VERSION = re.compile(r"Version:\s*([0-9][\w.\-]*)")
_SMI_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+([A-Za-z0-9][\w.\-]*)\s*\|\s*([A-Za-z]+)\s*\|")


def parse_npu_smi(text: str) -> NpuSmi:
    """`npu-smi info`: the tool's version and one (id, name, health) per NPU row (chip rows are skipped)."""
    m = _SMI_VERSION.search(text)
    npus = []
    for line in text.splitlines():
        row = _SMI_NPU_ROW.match(line.strip())
        if row:
            npus.append((int(row.group(1)), row.group(2), row.group(3)))
    return NpuSmi(m.group(1) if m else None, npus)


def read_version_file(text: str) -> str | None:
    """`version=X` / `Version=X` (driver version.info, CANN *_install.info) or version.cfg's `[inner:X]`."""
    m = re.search(r"^\s*version\s*=\s*(\S+)", text, re.IGNORECASE | re.MULTILINE)
    if m:
        return m.group(1).strip("\"'")
    m = re.search(r"running_version\s*=\s*\[[^:\]]*:([^\]]+)\]", text)
    return m.group(1).strip() if m else None


def cann_version_files(root: Path) -> list[Path]:
    """Where the CANN toolkit records its version, most specific first."""
    latest = root / "ascend-toolkit" / "latest"
    return [*sorted(latest.glob("*-linux/ascend_toolkit_install.info")), latest / "ascend_toolkit_install.info",
            latest / "version.cfg", *sorted(latest.glob("*-linux/version.cfg"))]


@dataclass
class EnvFacts:
    """What the node reported (gathered by tests/npu/conftest.py); None = could not be found."""

    npu_smi_text: str | None = None
    cann_version: str | None = None
    cann_source: str = ""
    driver_version: str | None = None
    torch_version: str | None = None
    torch_npu_version: str | None = None
    npu_device_count: int | None = None
    vllm_ascend_c_error: str | None = None  # None = loaded
    vllm_ascend_version: str | None = None
    errors: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ speed
@dataclass
class SpeedRun:
    engine: str  # "int8" | "bf16"
    prompts: int
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


# ------------------------------------------------------------------------------------------------ cann-pairing
# Imports torch_npu, loads its ATB op library (where Ascend/pytorch #99 failed: nnal's libtbe_adapter.so, loaded by
# torch_npu/op_plugin/atb/_atb_ops.py) and runs one op on the NPU.
IMPORT_PROBE = (
    "import importlib, json, torch, torch_npu\n"
    "try:\n    importlib.import_module('torch_npu.op_plugin.atb._atb_ops')\n"
    "except ModuleNotFoundError:\n    pass\n"
    "x = (torch.ones(2, device='npu') * 2).sum().item()\n"
    "print(json.dumps({'torch': torch.__version__, 'torch_npu': torch_npu.__version__, 'op': x}))\n")


@dataclass
class ImportProbe:
    """`python -c IMPORT_PROBE` in a fresh process, and the versions known without importing torch_npu."""

    returncode: int
    output: str  # stdout + stderr
    torch_npu_version: str | None  # the installed distribution's metadata
    cann_version: str | None  # as the environment step found it


# ------------------------------------------------------------------------------------------------ ray-npu
PROBE_MARK = "ROLLOUT8_NPU_PROBE "


DEFAULT_RAY_JOB_API = "http://127.0.0.1:8265"  # the job API stays on loopback (README: the dashboard has no auth)
NO_RAY = ("no Ray job API answers at {address}: start Ray on this node first (the playbook's runtime and ray "
          "roles, or `ray start --head --resources '{{\"NPU\": 8}}'` with " + NOSET + "=1 exported), or name it "
          "with ROLLOUT8_ACCEPT_RAY_ADDRESS")


def ray_job_address(env: dict) -> str:
    """Where the ray-npu step submits: ROLLOUT8_ACCEPT_RAY_ADDRESS, else RAY_ADDRESS if it is the job API's http
    address (a bare HOST:PORT names the GCS, which `ray job submit` cannot use), else the loopback job API."""
    for key in ("ROLLOUT8_ACCEPT_RAY_ADDRESS", "RAY_ADDRESS"):
        value = env.get(key, "").strip()
        if value.startswith(("http://", "https://")):
            return value
        if value and key == "ROLLOUT8_ACCEPT_RAY_ADDRESS":
            return f"http://{value}"
    return DEFAULT_RAY_JOB_API


def parse_probes(text: str) -> dict[str, dict]:
    """The probe lines a Ray job printed (`ROLLOUT8_NPU_PROBE {json}`, anywhere in a line: Ray prefixes worker
    output), keyed by their `where` (entrypoint, task). A line that does not parse is skipped."""
    import json

    found: dict[str, dict] = {}
    for line in text.splitlines():
        _, mark, rest = line.partition(PROBE_MARK)
        if not mark:
            continue
        try:
            probe = json.loads(rest.strip())
        except ValueError:
            continue
        if isinstance(probe, dict) and "where" in probe:
            found[probe["where"]] = probe
    return found


# ------------------------------------------------------------------------------------------------ weight-sync
# Below 0.5 GB/s a 7B sync (15 GB of bf16) takes > 30 s. For scale: verl #7060 reports 4-6 s per sync for 7B on
# H100 (~3 GB/s); SkyRL #176's INT8 sync of a 32B model (65 GB) took 140 s (~0.47 GB/s), the case to catch.
MIN_SYNC_GBPS = 0.5


@dataclass
class SyncTiming:
    seconds: float  # model.load_weights (FlashRL's patched one), the post-load step included
    post_load_seconds: float | None  # inside the quant methods' process_weights_after_loading
    bytes: int  # bf16 bytes handed to load_weights
    parameters: int
    parts: dict | None = None  # rollout8.node.sync_timing's parts of the same sync (seconds), when measured


def min_sync_gbps(env: dict) -> float:
    """ROLLOUT8_ACCEPT_MIN_SYNC_GBPS, else MIN_SYNC_GBPS; a value that is not a positive number is refused."""
    raw = env.get("ROLLOUT8_ACCEPT_MIN_SYNC_GBPS", "").strip()
    if not raw:
        return MIN_SYNC_GBPS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"ROLLOUT8_ACCEPT_MIN_SYNC_GBPS={raw!r}: give a positive number of GB/s")
    return value


def generated_pair_bytes(shape) -> int:
    """Disk a generated pair of `shape` (quant.testmodels.ModelShape) takes in the work directory: the bf16 model,
    its W8A8 twin (linear weights int8, the rest bf16) and the twin's ascend conversion."""
    h, n = shape.hidden_size, shape.num_hidden_layers
    kv = shape.num_key_value_heads * shape.head_dim
    linear = n * (2 * h * h + 2 * h * kv + 3 * h * shape.intermediate_size)
    total = shape.num_parameters()
    return 2 * total + 2 * (linear + 2 * (total - linear))


def room_problem(free: int, need: int, where) -> str | None:
    """One line when `where` lacks `need` bytes (with 10% to spare), else None."""
    if free >= need * 1.1:
        return None
    return (f"needs ~{need / 1e9:.0f} GB free in {where} for the generated 7B-shaped pair, has {free / 1e9:.0f} GB: "
            f"point ROLLOUT8_ACCEPT_WORK at a larger disk, or give your own pair (ROLLOUT8_ACCEPT_BF16 / _INT8)")


# ------------------------------------------------------------------------------------------------ hccl
HCCL_MASTER, HCCL_RANK, HCCL_WORLD = "ROLLOUT8_ACCEPT_HCCL_MASTER", "ROLLOUT8_ACCEPT_HCCL_RANK", \
    "ROLLOUT8_ACCEPT_HCCL_WORLD"


@dataclass(frozen=True)
class HcclPlan:
    master: str
    port: int
    rank: int
    world: int


def hccl_plan(env: dict) -> tuple[HcclPlan | None, str | None]:
    """The two-node plan from the environment: (plan, None), (None, None) with one node, or (None, problem)."""
    master = env.get(HCCL_MASTER, "").strip()
    if not master:
        return None, None
    host, _, port = master.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None, f"{HCCL_MASTER}={master!r}: give HOST:PORT (the first node's cluster IP and a free port)"
    rank, world = env.get(HCCL_RANK, "").strip(), env.get(HCCL_WORLD, "2").strip()
    if not world.isdigit() or int(world) < 2:
        return None, f"{HCCL_WORLD}={world!r}: give the number of nodes taking part (2 or more)"
    if not rank.isdigit() or int(rank) >= int(world):
        return None, f"{HCCL_RANK}={rank!r}: give 0 on the first node and 1 .. {int(world) - 1} on the others"
    return HcclPlan(host.strip("[]"), int(port), int(rank), int(world)), None


def largest_weight(config: dict) -> tuple[str, tuple[int, int]]:
    """The largest single weight of a dense decoder from its config.json: embeddings (or lm_head), an MLP
    projection, or the attention's q/o projection."""
    h, v = int(config["hidden_size"]), int(config["vocab_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or h // heads)
    candidates = [("model.embed_tokens.weight", (v, h)),
                  ("model.layers.0.mlp.gate_proj.weight", (int(config["intermediate_size"]), h)),
                  ("model.layers.0.self_attn.q_proj.weight", (heads * head_dim, h))]
    return max(candidates, key=lambda c: c[1][0] * c[1][1])
