"""The NPU acceptance suite: what a user runs on the first real Ascend node before any training.

Every test here is marked `npu`. Without an NPU (no /dev/davinci*, no npu-smi, no torch_npu or vllm_ascend)
each is skipped with that reason; `make accept-npu` refuses up front with a plain message instead.

Models (environment variables; all optional):
  ROLLOUT8_ACCEPT_BF16 / ROLLOUT8_ACCEPT_INT8  a real bf16 model and its W8A8 twin (compressed-tensors, converted
                                               here with `rollout8 convert --to ascend`, or already ascend)
  ROLLOUT8_ACCEPT_PROFILE                       their FlashRL profile (computed with `rollout8 profile` if unset)
  ROLLOUT8_ACCEPT_PRESET                        without the two above: a generated pair (default bench-0.5b, the
                                               Qwen2.5-0.5B shape with random weights; no hub access)
  ROLLOUT8_ACCEPT_SYNC_PRESET                   the weight-sync step's generated pair when no model is given
                                               (default bench-7b, the Qwen2.5-7B shape: ~33 GB on disk)
  ROLLOUT8_ACCEPT_WORK                          where models, configs and engine outputs go
                                               (default ~/.cache/rollout8/accept)
The other steps' settings (rollout8.node.accept_npu; README "Run the NPU acceptance suite first"):
  ROLLOUT8_ACCEPT_RAY_ADDRESS                   Ray's job API for the ray-npu step (default RAY_ADDRESS, else
                                               http://127.0.0.1:8265); no Ray there: the step is skipped
  ROLLOUT8_ACCEPT_MIN_SYNC_GBPS                 the weight-sync step's floor (default accept_npu.MIN_SYNC_GBPS)
  ROLLOUT8_ACCEPT_HCCL_MASTER / _RANK / _WORLD  the second node for the hccl step (unset: skipped, saying how)
Every step's PASS/FAIL line is printed at the end of the run (and written to WORK/acceptance.txt).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from npu_support import INT8_STEPS, RESULTS, STEP_ORDER, EngineRun, rollout8_ok, run_engine

from rollout8.node.accept_npu import NEEDS_NPU, format_report, npu_absent_reason

HERE = Path(__file__).resolve().parent


def _cann_pin() -> str:
    try:
        from rollout8.lock import load_lock

        return load_lock().cann.version
    except Exception:  # noqa: BLE001 - only decorates the skip message
        return "as pinned"


def pytest_collection_modifyitems(config, items):
    why = npu_absent_reason()
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.npu)
            if why:
                item.add_marker(pytest.mark.skip(reason=NEEDS_NPU.format(cann=_cann_pin(), why=why)))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not RESULTS:
        return
    ordered = [RESULTS[s] for s in STEP_ORDER if s in RESULTS]
    text = format_report(ordered)
    terminalreporter.section("NPU acceptance")
    for r in ordered:
        terminalreporter.write_line(r.line())
        for d in r.details if r.step in ("speed", "weight-sync") else []:
            terminalreporter.write_line("    " + d)
    terminalreporter.write_line(text.splitlines()[-1])
    work = os.environ.get("ROLLOUT8_ACCEPT_WORK_RESOLVED")
    if work:
        Path(work, "acceptance.txt").write_text(text + "\n")


@dataclass
class AcceptModels:
    bf16: Path
    int8: Path  # ascend layout
    profile: Path
    num_layers: int


@pytest.fixture(scope="session")
def work() -> Path:
    root = Path(os.environ.get("ROLLOUT8_ACCEPT_WORK", Path.home() / ".cache" / "rollout8" / "accept"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["ROLLOUT8_ACCEPT_WORK_RESOLVED"] = str(root)
    return root


def prepare_pair(work: Path, *, bf16: str | None, int8: str | None, preset: str, profile: str | None) -> AcceptModels:
    """The given pair (bf16 + W8A8, converted to the ascend layout if needed), or a generated one of `preset`,
    with its FlashRL profile."""
    from rollout8.quant.layout import ASCEND, detect_layout

    if bool(bf16) != bool(int8):
        pytest.fail("set both ROLLOUT8_ACCEPT_BF16 and ROLLOUT8_ACCEPT_INT8, or neither")
    if not bf16:
        rollout8_ok("make-test-model", "-o", str(work / f"pair-{preset}"), "--preset", preset)
        bf16, int8 = str(work / f"pair-{preset}" / "bf16"), str(work / f"pair-{preset}" / "int8")
    bf16_dir, int8_dir = Path(bf16).resolve(), Path(int8).resolve()
    if detect_layout(int8_dir) != ASCEND:
        converted = work / f"{int8_dir.parent.name}-{int8_dir.name}-ascend"
        rollout8_ok("convert", "--to", "ascend", str(int8_dir), str(converted))
        int8_dir = converted
    if profile:
        profile_path = Path(profile).resolve()
    else:
        profile_path = work / f"{int8_dir.name}.profile.pt"
        if not profile_path.is_file():
            rollout8_ok("profile", "-m", str(bf16_dir), "-q", str(int8_dir), "-o", str(profile_path), "--quiet")
    layers = json.loads((bf16_dir / "config.json").read_text())["num_hidden_layers"]
    return AcceptModels(bf16_dir, int8_dir, profile_path, layers)


@pytest.fixture(scope="session")
def models(work) -> AcceptModels:
    return prepare_pair(work, bf16=os.environ.get("ROLLOUT8_ACCEPT_BF16"), int8=os.environ.get("ROLLOUT8_ACCEPT_INT8"),
                        preset=os.environ.get("ROLLOUT8_ACCEPT_PRESET", "bench-0.5b"),
                        profile=os.environ.get("ROLLOUT8_ACCEPT_PROFILE"))


@pytest.fixture(scope="session")
def sync_models(work, request) -> AcceptModels:
    """The weight-sync step's model: the user's pair if given, else a generated 7B-shaped one."""
    if os.environ.get("ROLLOUT8_ACCEPT_BF16"):
        return request.getfixturevalue("models")
    return prepare_pair(work, bf16=os.environ.get("ROLLOUT8_ACCEPT_BF16"), int8=os.environ.get("ROLLOUT8_ACCEPT_INT8"),
                        preset=os.environ.get("ROLLOUT8_ACCEPT_SYNC_PRESET", "bench-7b"),
                        profile=os.environ.get("ROLLOUT8_ACCEPT_PROFILE"))


@pytest.fixture(scope="session")
def sync_run(sync_models, work) -> EngineRun:
    """Two timed syncs (the first pays one-off allocations; the step judges the second)."""
    config = work / "flashrl-int8-sync.yaml"
    rollout8_ok("setup", "--fn", "int8", "-m", str(sync_models.int8), "-p", str(sync_models.profile), "-o",
                str(config))
    return run_engine(work / "engine-sync", model=sync_models.bf16, flashrl_config=config,
                      steps=["sync:sync1", "sync:sync2"])


@pytest.fixture(scope="session")
def int8_config(models, work) -> Path:
    out = work / "flashrl-int8.yaml"
    rollout8_ok("setup", "--fn", "int8", "-m", str(models.int8), "-p", str(models.profile), "-o", str(out))
    return out


@pytest.fixture(scope="session")
def bf16_config(models, work) -> Path:
    out = work / "flashrl-bf16.yaml"
    rollout8_ok("setup", "--fn", "bf16", "-b", str(models.bf16), "-o", str(out))
    return out


@pytest.fixture(scope="session")
def int8_run(models, int8_config, work) -> EngineRun:
    return run_engine(work / "engine-int8", model=models.bf16, flashrl_config=int8_config, steps=INT8_STEPS)


@pytest.fixture(scope="session")
def bf16_run(models, bf16_config, work) -> EngineRun:
    return run_engine(work / "engine-bf16", model=models.bf16, flashrl_config=bf16_config, steps=["speed:speed"])
