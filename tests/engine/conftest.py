"""Fixtures of the engine tier: the model pair, its FlashRL profile and configs, and engine runs.

Every test here is marked `engine`. In an interpreter without vLLM (the main .venv) each is skipped with the
reason; `make test-engine` runs this directory with the engine venv's python. Engine runs are session-scoped
and shared between tests, because each engine start costs about half a minute.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_platform import engine_available, int8_expectations  # the engine harness: virtual/engine
from engine_runs import MAIN_STEPS, EngineRun, rollout8, run_engine

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    ok, why = engine_available()
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.engine)
            if not ok:
                item.add_marker(pytest.mark.skip(reason=why))


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engine")


@pytest.fixture(scope="session")
def pair(work):
    """The tiny-engine bf16/int8 pair (head_dim 64: vLLM's CPU attention refuses smaller heads)."""
    rollout8("make-test-model", "-o", str(work / "pair"), "--preset", "tiny-engine", "--seed", "0")
    from rollout8.quant.testmodels import make_pair

    return make_pair(work / "pair", preset="tiny-engine", seed=0)  # already built: returns the paths


@pytest.fixture(scope="session")
def profile(pair, work) -> Path:
    out = work / "profile.pt"
    rollout8("profile", "-m", str(pair.bf16), "-q", str(pair.int8), "-o", str(out))
    return out


@pytest.fixture(scope="session")
def served_int8(pair, work) -> Path:
    """The int8 model the engine serves on this platform: the compressed-tensors twin, or on an NPU host its
    lossless `rollout8 convert --to ascend` copy (same int8 values, vllm-ascend's layout)."""
    if int8_expectations()["layout"] == "ascend":
        out = work / "int8-ascend"
        rollout8("convert", "--to", "ascend", str(pair.int8), str(out), "--force")
        return out
    return pair.int8


@pytest.fixture(scope="session")
def int8_config(served_int8, profile, work) -> Path:
    out = work / "flashrl-int8.yaml"
    rollout8("setup", "--fn", "int8", "-m", str(served_int8), "-p", str(profile), "-o", str(out))
    return out


@pytest.fixture(scope="session")
def hybrid_config(pair, served_int8, profile, work) -> Path:
    out = work / "flashrl-hybrid.yaml"
    rollout8("setup", "--fn", "hybrid", "-m", str(served_int8), "-p", str(profile), "-b", str(pair.bf16),
             "--mix", "1:1", "-o", str(out))
    return out


@pytest.fixture(scope="session")
def int8_run(pair, int8_config, work) -> EngineRun:
    """The main engine: vllm.LLM(model=<bf16 dir>) under the int8 config, generate, reloads, drift."""
    return run_engine(work / "run-int8", model=pair.bf16, steps=MAIN_STEPS, flashrl_config=int8_config,
                      continue_on_error=True)
