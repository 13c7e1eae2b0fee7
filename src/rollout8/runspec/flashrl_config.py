"""`rollout8 setup`: write the FlashRL config YAML (int8, bf16 or hybrid) with absolute paths.

What `flashrl setup` writes, without its two traps: it never touches usercustomize.py (FlashRL's `setup`
re-enables the auto patch every time it runs; the bundle uses the manual patch in verl/__init__.py), and
the hybrid bf16 entry carries `load_format: auto` (FlashRL 1.0.3's `setup -a --fn bf16` asserts on it).

The file is `{configs: [entry, ...]}`. FlashRL's patched `vllm.LLM.__init__` reads it from FLASHRL_CONFIG and
each rollout worker takes entry `(RANK // (TP * PP)) % len(configs)`: DP rollout worker k gets entry
k % n, which is how hybrid int8/bf16 rollout across DP workers works (`entry_for_rank`, `rank_mix`).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import yaml

from ..errors import SpecError
from ..fileutil import atomic_write
from ..yamlio import read_yaml

# The fields FlashRL 1.0.3's configs dataclasses give each function (flash_rl/configs/int8.py, bf16.py).
BASE_ENTRY = {"distributed_executor_backend": "external_launcher", "load_format": "auto"}

# Marker file of the vllm-ascend (msModelSlim) int8 layout written by `rollout8 convert`.
ASCEND_DESCRIPTION = "quant_model_description.json"


def _is_flashrl_config(path: Path) -> bool:
    if path.stat().st_size > 1_000_000:
        return False
    data = read_yaml(path, what="FlashRL config")  # SpecError on a duplicated key: not one (check_output's test)
    return isinstance(data, dict) and isinstance(data.get("configs"), list)


# What an existing `-o` file must be to be replaced without --force.
CONFIG_KIND = ("a FlashRL config", _is_flashrl_config)


def detect_layout(model_dir: Path) -> str:
    """compressed-tensors (HF W8A8) or ascend (vllm-ascend W8A8_DYNAMIC, has quant_model_description.json)."""
    return "ascend" if (Path(model_dir) / ASCEND_DESCRIPTION).is_file() else "compressed-tensors"


def layout_entry_fields(layout: str) -> dict:
    """Extra FlashRL entry fields a model layout needs.

    The vllm-ascend layout (`rollout8 convert --to ascend`) has no quantization_config in config.json, so it
    must be named: `quantization: ascend` (FlashRL passes it through to vllm.LLM, keys_to_overload in
    flash_rl/vllm_patch.py), plus `module_attribute_to_preserve` for W8A8_DYNAMIC's derived scale. Why, from
    vllm-ascend 7e16b4a's source: rollout8.quant.layout.flashrl_entry_fields.
    """
    if layout not in ("compressed-tensors", "ascend"):
        raise SpecError(f"unknown int8 model layout {layout!r} (compressed-tensors or ascend)")
    from ..quant.layout import flashrl_entry_fields

    return flashrl_entry_fields(layout)


def int8_entry(model: str, profile: str, layout: str = "compressed-tensors") -> dict:
    return {**BASE_ENTRY, "fn": "int8", "model": model, "profile": profile, **layout_entry_fields(layout)}


def bf16_entry(model: str | None) -> dict:
    entry = {**BASE_ENTRY, "fn": "bf16"}
    if model is not None:
        entry["model"] = model
    return entry


def build_config(quantization: str, *, int8_model: str | None, profile: str | None, bf16_model: str | None,
                 mix: tuple[int, int] = (1, 1), layout: str = "compressed-tensors") -> dict:
    """The FlashRL config mapping. Hybrid lists the int8 entries first, then the bf16 ones."""
    for label, value in (("int8 model", int8_model), ("profile", profile), ("bf16 model", bf16_model)):
        if value is not None and not PurePosixPath(value).is_absolute():
            raise SpecError(f"FlashRL {label} path {value!r} must be absolute (FlashRL treats other paths as hub ids)")
    if quantization in ("int8", "hybrid") and (int8_model is None or profile is None):
        raise SpecError(f"{quantization}: the int8 model and the profile are required")
    if quantization == "int8":
        entries = [int8_entry(int8_model, profile, layout)]
    elif quantization == "bf16":
        entries = [bf16_entry(bf16_model)]
    elif quantization == "hybrid":
        n_int8, n_bf16 = mix
        if n_int8 < 1 or n_bf16 < 1:
            raise SpecError(f"hybrid mix {n_int8}:{n_bf16}: both counts must be >= 1")
        entries = [int8_entry(int8_model, profile, layout) for _ in range(n_int8)]
        entries += [bf16_entry(bf16_model) for _ in range(n_bf16)]
    else:
        raise SpecError(f"unknown quantization {quantization!r} (int8, bf16 or hybrid)")
    return {"configs": entries}


def dump_config(config: dict) -> str:
    return yaml.safe_dump(config, sort_keys=True, default_flow_style=False)


def write_config(config: dict, output: Path) -> Path:
    """Write atomically (a reader never sees half a file); returns the absolute path."""
    return atomic_write(Path(output).absolute(), dump_config(config))


def config_for_spec(spec, *, node_paths: bool = True) -> dict:
    """The FlashRL config of a run spec (node paths by default: what the nodes read)."""
    if node_paths:
        path = spec.node_path
    else:
        def path(what: str) -> str:
            local = spec.local_path(what)
            return None if local is None else str(local)
    mix = spec.rollout.mix
    layout = spec.model.layout
    int8 = path("int8") if spec.model.int8 is not None else None
    profile = path("profile") if spec.model.int8 is not None else None
    return build_config(spec.rollout.quantization, int8_model=int8, profile=profile, bf16_model=path("bf16"),
                        mix=(mix.int8, mix.bf16) if mix else (1, 1), layout=layout)


# ---------------------------------------------------------------------------------------------- ranks
def entry_for_rank(rank: int, n_entries: int, tp: int = 1, pp: int = 1) -> int:
    """FlashRL's choice (flash_rl/vllm_patch.py): dp_rank = RANK // (TP * PP); entry = dp_rank % n."""
    if n_entries < 1 or tp < 1 or pp < 1 or rank < 0:
        raise ValueError("need rank >= 0, n_entries >= 1, tp >= 1, pp >= 1")
    return (rank // (tp * pp)) % n_entries


def rank_mix(config: dict, world_size: int, tp: int = 1, pp: int = 1) -> list[str]:
    """The FlashRL function (int8/bf16) each rollout rank 0..world_size-1 runs."""
    entries = config["configs"]
    return [entries[entry_for_rank(rank, len(entries), tp, pp)].get("fn", "int8") for rank in range(world_size)]


def mix_summary(config: dict, world_size: int, tp: int = 1, pp: int = 1) -> dict[str, int]:
    """How many DP rollout workers (TP*PP ranks each) run each function."""
    per_rank = rank_mix(config, world_size, tp, pp)
    out: dict[str, int] = {}
    for dp in range(world_size // (tp * pp)):
        fn = per_rank[dp * tp * pp]
        out[fn] = out.get(fn, 0) + 1
    return out
