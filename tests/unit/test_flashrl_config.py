"""`rollout8 setup`: the FlashRL YAML for int8, bf16 and hybrid, read back by FlashRL's own code.

FlashRL reads FLASHRL_CONFIG inside its patched `vllm.LLM.__init__`; flashrl_log_emitter.py runs that real code
(against a stand-in vllm package) for a list of ranks, and FlashRL logs which entry each rank took.
"""

from __future__ import annotations

import hashlib
import json
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from flashrl_log_emitter import emit  # tests/support

from rollout8.cli import main
from rollout8.errors import SpecError
from rollout8.runspec.flashrl_config import (
    build_config,
    entry_for_rank,
    mix_summary,
    rank_mix,
    write_config,
)

FLASH_RL = Path(__import__("importlib").util.find_spec("flash_rl").origin).parent


def flashrl_reads(config_path: Path, ranks: list[int], tp: int, tmp: Path) -> dict[int, dict]:
    """Run FlashRL's patched vllm.LLM.__init__ once per rank; what each rank logged about its entry."""
    emit(tmp, config_path, [{"rank": r, "tp": tp, "syncs": 1, "file": str(tmp / f"rank{r}.log")} for r in ranks])
    out = {}
    for r in ranks:
        text = (tmp / f"rank{r}.log").read_text()
        entry = dict(re.findall(rf"rank {r} flash_rl config: (\w+): (.*)", text))
        using = re.search(r"Using config (\d+) of (\d+)", text)
        out[r] = {"entry": entry, "index": int(using[1]), "count": int(using[2]),
                  "load_weights_patched": "Successfully patched the load_weights function of vllm" in text,
                  "quantized": "flash_rl quantization is called" in text}
    return out


@pytest.fixture
def paths(tmp_path, model_pair):
    import shutil

    import torch

    shutil.copytree(model_pair.int8, tmp_path / "int8")  # setup refuses a -m that holds no int8 weights
    shutil.copytree(model_pair.bf16, tmp_path / "bf16")
    torch.save({}, tmp_path / "profile.pt")
    return tmp_path


def flashrl_defaults(fn: str) -> dict:
    """FlashRL's own defaults for a function (flash_rl.configs), read in a subprocess (its import sets up logging)."""
    code = ("import json, dataclasses; from flash_rl.configs import get_default_config; "
            f"print(json.dumps(dataclasses.asdict(get_default_config({fn!r}))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_int8_entry_extends_flashrl_defaults(paths):
    config = build_config("int8", int8_model=str(paths / "int8"), profile=str(paths / "profile.pt"), bf16_model=None)
    [entry] = config["configs"]
    assert flashrl_defaults("int8").items() <= entry.items()
    assert entry["model"] == str(paths / "int8") and entry["profile"] == str(paths / "profile.pt")


def test_bf16_entry_uses_load_format_auto(paths):
    [entry] = build_config("bf16", int8_model=None, profile=None, bf16_model=str(paths / "bf16"))["configs"]
    defaults = flashrl_defaults("bf16")
    assert entry["fn"] == defaults["fn"] == "bf16"
    assert entry["distributed_executor_backend"] == defaults["distributed_executor_backend"]
    assert entry["load_format"] == "auto"  # what `flashrl setup -a --fn bf16` needs (trap 12)


@pytest.mark.slow
@pytest.mark.parametrize("quantization", ["int8", "bf16", "hybrid"])
def test_flashrl_loads_what_setup_writes(paths, tmp_path, quantization):
    config = build_config(quantization, int8_model=str(paths / "int8"), profile=str(paths / "profile.pt"),
                          bf16_model=str(paths / "bf16"))
    path = write_config(config, paths / f"{quantization}.yaml")
    assert yaml.safe_load(path.read_text()) == config
    seen = flashrl_reads(path, [0, 1], tp=1, tmp=tmp_path / "run")
    for rank, got in seen.items():
        expected = config["configs"][entry_for_rank(rank, len(config["configs"]))]
        assert got["count"] == len(config["configs"])
        assert got["entry"] == {k: str(v) for k, v in expected.items()}
        assert got["load_weights_patched"] == (expected["fn"] == "int8")
        assert got["quantized"] == (expected["fn"] == "int8")


@pytest.mark.slow
def test_hybrid_mix_per_rank_matches_flashrl(paths, tmp_path):
    """3 int8 : 1 bf16 over 16 ranks with TP 2: 8 DP workers, entries 0,1,2,3,0,1,2,3 -> 6 int8 + 2 bf16."""
    config = build_config("hybrid", int8_model=str(paths / "int8"), profile=str(paths / "profile.pt"),
                          bf16_model=str(paths / "bf16"), mix=(3, 1))
    path = write_config(config, paths / "hybrid.yaml")
    expected = rank_mix(config, world_size=16, tp=2)
    assert expected == ["int8"] * 6 + ["bf16"] * 2 + ["int8"] * 6 + ["bf16"] * 2
    assert mix_summary(config, world_size=16, tp=2) == {"int8": 6, "bf16": 2}
    seen = flashrl_reads(path, list(range(16)), tp=2, tmp=tmp_path / "run")
    assert [seen[r]["entry"]["fn"] for r in range(16)] == expected
    assert [seen[r]["index"] for r in range(16)] == [(r // 2) % 4 for r in range(16)]


def test_entry_choice_is_flashrls_formula():
    """The formula entry_for_rank implements is the one in FlashRL's source (fails if FlashRL changes it)."""
    source = (FLASH_RL / "vllm_patch.py").read_text()
    assert "mp_size = kwargs.get('tensor_parallel_size', 1) * kwargs.get('pipeline_parallel_size', 1)" in source
    assert "dp_rank = rank // mp_size" in source
    assert "config_index = dp_rank % config_count" in source
    assert [entry_for_rank(r, 3, tp=2, pp=2) for r in range(12)] == [0] * 4 + [1] * 4 + [2] * 4


def test_relative_paths_refused():
    with pytest.raises(SpecError, match="must be absolute"):
        build_config("int8", int8_model="models/int8", profile="/p.pt", bf16_model=None)


def test_ascend_layout_names_the_quantization(paths):
    [entry] = build_config("int8", int8_model=str(paths / "int8"), profile=str(paths / "profile.pt"),
                           bf16_model=None, layout="ascend")["configs"]
    assert entry["quantization"] == "ascend"


def _usercustomize_state() -> dict:
    out = {}
    for d in site.getsitepackages() + [site.getusersitepackages()]:
        f = Path(d) / "usercustomize.py"
        out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else None
    return out


def test_setup_cli_writes_absolute_paths_and_never_touches_usercustomize(paths, tmp_path, monkeypatch, capsys):
    before = _usercustomize_state()
    monkeypatch.chdir(paths)
    out = tmp_path / "out" / "flashrl.yaml"
    assert main(["setup", "--fn", "hybrid", "-m", "int8", "-p", "profile.pt", "-b", "bf16", "--mix", "2:1",
                 "--world-size", "6", "-o", str(out)]) == 0
    config = yaml.safe_load(out.read_text())
    assert [e["fn"] for e in config["configs"]] == ["int8", "int8", "bf16"]
    assert all(Path(e["model"]).is_absolute() for e in config["configs"])
    assert config["configs"][0]["profile"] == str(paths / "profile.pt")
    assert "bf16 x2, int8 x4" in capsys.readouterr().out
    assert _usercustomize_state() == before


def test_setup_cli_refuses_missing_paths(paths, tmp_path, capsys):
    assert main(["setup", "--fn", "int8", "-m", str(paths / "nope"), "-o", str(tmp_path / "x.yaml")]) == 2
    assert "--model" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_setup_from_spec_uses_node_paths(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "f.yaml"
    assert main(["setup", "--spec", str(repo / "configs/runs/qwen2.5-32b-int8-2node.yaml"), "-o", str(out)]) == 0
    [entry] = yaml.safe_load(out.read_text())["configs"]
    root = "/var/lib/rollout8/runs/qwen2.5-32b-int8-2node"
    assert entry["model"] == f"{root}/models/int8" and entry["profile"] == f"{root}/profile.pt"
    assert entry["quantization"] == "ascend"
