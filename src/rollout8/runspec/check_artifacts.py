"""The rules of `rollout8 check` on the files of a run on this machine: the artifacts' paths, dense or mixture of
experts, the int8 layout, the model directories, and the profile against the int8 and bf16 models. Each reports
through a Collector (check_common); check.run_checks calls them in order (and keeps the plan step's cache of a
passing profile check: check.check_profile).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import ModelError
from ..fileutil import special_kind
from ..yamlio import load_json
from .check_common import Collector, as_int, verl_field
from .node_path import mount_problem, node_absolute
from .render import Rendered
from .runspec import RunSpec

MOE_CONFIG_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")


MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3", "dbrx", "olmoe", "jamba")


def check_paths(c: Collector, spec: RunSpec, artifacts: bool = True) -> None:
    """Where each artifact is and, with artifacts, that it is there and of its kind. Without (check
    --no-artifacts, a spec judged before its files exist): only what the paths themselves say."""
    if "FLASHRL_CONFIG" in spec.env:
        c.error("flashrl-paths", "env.FLASHRL_CONFIG",
                f"is set by render to {spec.node_path('flashrl')} (deploy.root); remove it from env")
    shared = spec.deploy.shared_storage
    fields = {"bf16": "model.bf16", "int8": "model.int8", "profile": "model.profile", "train": "data.train",
              "val": "data.val", "reward": "data.reward"}
    for name in spec.artifacts():
        local = spec.local_path(name)
        field = fields[name]
        if name == "profile" and spec.model.profile is None:
            field = "model.profile (default <model.int8>/profile.pt)"
        if shared:
            if not PurePosixPath(str(local)).is_absolute():
                c.error("flashrl-paths", field, f"{local} must be an absolute path on every node "
                        "(deploy.shared_storage: true); a relative FlashRL path is taken for a hub id")
                continue
            try:
                problem = mount_problem(node_absolute(str(local)))
            except ValueError as exc:
                problem = f"cannot be a node path: {exc}"
            if problem:
                c.error("flashrl-paths", field, f"{local} {problem}: the training container could not see it "
                        "(each shared-storage path is mounted into it at the same path); move it into a "
                        "directory of its own on the shared storage")
                continue
            elif artifacts and not Path(local).exists():
                c.info("flashrl-paths", field, f"{local} is not on this machine: not checked here "
                       "(shared storage; the probe job checks it on every node)")
            continue
        if not artifacts:
            continue
        if kind := special_kind(local):  # found without opening it: a named pipe would block every read
            c.error("flashrl-paths", field, f"{local} is {kind}, not a "
                    f"{'model directory' if name in ('bf16', 'int8') else 'file'}: name the file itself")
            continue
        if not Path(local).exists():
            what = "file" if name in ("profile", "train", "val", "reward") else "model directory"
            hint = {"profile": "; make it with `rollout8 profile -m BF16 -q INT8 -o PROFILE`"}.get(name, "")
            c.error("flashrl-paths", field, f"{local}: {what} does not exist here (it is copied from here to "
                    f"{spec.node_path(name)} on every node){hint}")
        elif name in ("bf16", "int8") and not Path(local).is_dir():
            c.error("flashrl-paths", field, f"{local} is not a directory (expected an HF model directory)")
        elif name in ("train", "val") and Path(local).suffix != ".parquet":
            c.warning("flashrl-paths", field, f"{local}: verl reads parquet files (.parquet)")
        elif name == "reward" and (not Path(local).is_file() or "def compute_score" not in
                                   Path(local).read_text(errors="replace")):
            c.error("flashrl-paths", field, f"{local}: not a Python file defining compute_score(data_source, "
                    "solution_str, ground_truth, extra_info=None), which verl's custom_reward_function calls")


def _read_config(path: Path | None) -> dict | None:
    if path is None or not (path / "config.json").is_file():
        return None
    try:  # strict (a key given twice refused): check_models reports why it is not readable, naming the file
        config = load_json((path / "config.json").read_bytes(), source=path / "config.json", error=ModelError)
    except (OSError, ValueError, ModelError):  # ValueError: not JSON, or not UTF-8
        return None
    return config if isinstance(config, dict) else None  # a list or a number: check_models says it is no object


def is_moe_config(config: dict) -> str | None:
    """Why a config.json describes a mixture-of-experts model, or None."""
    for source in (config, config.get("text_config") or {}):
        if not isinstance(source, dict):
            continue
        for key in MOE_CONFIG_KEYS:
            value = source.get(key)
            if isinstance(value, int) and value > 1:
                return f"{key}={value}"
        model_type = str(source.get("model_type", ""))
        if model_type in MOE_MODEL_TYPES:
            return f"model_type={model_type}"
    return None


def check_moe(c: Collector, spec: RunSpec, artifacts: bool = True) -> None:
    if not spec.flashrl:
        return
    fix = ("FlashRL's profile covers dense layers only, MoE expert weights would not be requantized; "
           "use rollout.quantization: bf16 for this model")
    if spec.model.moe:
        c.error("moe", "model.moe", f"true: {fix}")
        return
    if not artifacts:
        return
    for field, path in (("model.bf16", spec.model.bf16), ("model.int8", spec.model.int8)):
        config = _read_config(path)
        if config is not None:
            reason = is_moe_config(config)
            if reason:
                c.error("moe", field, f"{path}/config.json says mixture of experts ({reason}): {fix}")
            return
    if spec.model.moe is None:
        c.info("moe", "model.moe", "no config.json readable here: could not tell dense from MoE "
               "(set model.moe: false to state it)")


def check_layout(c: Collector, spec: RunSpec, artifacts: bool = True) -> None:
    if not spec.flashrl or spec.model.int8 is None:
        return
    from .flashrl_config import detect_layout

    if artifacts and spec.model.int8.is_dir():
        try:
            found = detect_layout(spec.model.int8)
        except ModelError:
            found = spec.model.layout  # what is wrong with the directory: check_models says it
        if found != spec.model.layout:
            c.error("layout", "model.layout", f"is {spec.model.layout} but {spec.model.int8} is in the {found} "
                    f"layout; set model.layout: {found}")
    if spec.cluster.accelerator == "npu" and spec.model.layout == "compressed-tensors":
        c.error("layout", "model.layout",
                "compressed-tensors W8A8 does not load on vllm-ascend at the pin (it maps every "
                "quantization_config to 'ascend' and fails with KeyError); convert the model with "
                "`rollout8 convert` and set model.layout: ascend")


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _layers(names: set[str]) -> str:
    idx = sorted({int(m.group(1)) for n in names if (m := _LAYER.search(n))})
    if not idx:
        return ""
    return f" (layers {idx[0]}..{idx[-1]})" if len(idx) > 1 else f" (layer {idx[0]})"


def _numel(x: Any) -> int:
    return int(x.numel()) if hasattr(x, "numel") else 1


def _sample(names: set[str]) -> str:
    items = sorted(names)
    return ", ".join(items[:3]) + (f", ... ({len(items)} in all)" if len(items) > 3 else "")


def check_models(c: Collector, spec: RunSpec) -> None:
    """The model directories are what their fields say: a readable config.json; the bf16 model holds no int8
    weights (the int8 directory given as model.bf16 would train on int8 codes); the int8 model holds int8 weights,
    each with its weight_scale; every shard's size agrees with its header (a truncated copy fails here, not on
    the nodes); each model's shard headers agree with its config.json and the two config.json agree on the
    network's shape (quant.pair: an int8 model of another model fails here, not in vLLM on the nodes)."""
    from ..quant.checkpoint import Checkpoint, read_json
    from ..quant.pair import config_mismatches, shape_problems

    wanted = [("model.bf16", spec.model.bf16, "bf16")]
    read: dict[str, tuple[Path, dict]] = {}
    if spec.flashrl and spec.model.int8 is not None:
        wanted.append(("model.int8", spec.model.int8, "int8"))
    for field, path, kind in wanted:
        if path is None or not path.is_dir():
            continue  # reported by check_paths, or not on this machine
        config = path / "config.json"
        if not config.is_file():
            c.error("models", field, f"{path}: no config.json: not a Hugging Face model directory (copy it whole)")
            continue
        try:
            parsed = read_json(config, "config.json")
            ckpt = Checkpoint(path)
        except ModelError as exc:
            c.error("models", field, str(exc))
            continue
        int8 = [n for n, t in ckpt.tensors.items() if t.dtype == "I8"]
        if kind == "bf16" and (int8 or "quantization_config" in parsed):
            c.error("models", field, f"{path} is a quantized model ({len(int8)} int8 tensors"
                    f"{', quantization_config in config.json' if 'quantization_config' in parsed else ''}): "
                    "model.bf16 must be the unquantized weights the trainer updates")
            continue
        problems = shape_problems(parsed, ckpt.tensors.values(), int8=kind == "int8")
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            c.error("models", field, f"{path}/{problems[0]}{more}: the shards and config.json are not of one "
                    "model; copy the model directory again, whole")
            continue
        read[kind] = (path, parsed)
        if kind == "int8":
            weights = ckpt.int8_weights()
            if not weights:
                c.error("models", field, f"{path} holds no int8 weights: not a W8A8 model (the bf16 directory "
                        "given as model.int8?)")
                continue
            unscaled = sorted(n for n in weights if n[: -len(".weight")] + ".weight_scale" not in ckpt.tensors)
            if unscaled:
                c.error("models", field, f"{len(unscaled)} int8 weight(s) have no weight_scale, e.g. {unscaled[0]}: "
                        "the checkpoint is incomplete; convert or copy it again")
    if "bf16" in read and "int8" in read:
        (bf16_dir, bf16_config), (int8_dir, int8_config) = read["bf16"], read["int8"]
        for key, ours, theirs in config_mismatches(bf16_config, int8_config)[:1]:
            c.error("models", "model.int8", f"{int8_dir}/config.json says {key} {theirs!r} but the bf16 model's "
                    f"({bf16_dir}/config.json) says {ours!r}: the int8 model is not this bf16 model quantized; "
                    "quantize model.bf16 (or name its int8 twin)")


def check_context(c: Collector, spec: RunSpec, r: Rendered) -> None:
    """The model's context holds prompt + response: verl's vLLM rollout asserts it when the rollout starts
    (verl 51d2104, vllm_rollout_spmd.py:167-198: max_position_embeddings of config.json, or of its llm_config or
    text_config, times rope_scaling's factor when set); vLLM refuses a longer max_model_len too."""
    path = spec.model.bf16
    config = _read_config(path)
    if config is None:
        return  # missing or unreadable: reported by check_paths or check_models
    prompt, response = as_int(c, r, "data.max_prompt_length"), as_int(c, r, "data.max_response_length")
    if prompt is None or response is None:
        return
    sections = [config] + [config[k] for k in ("llm_config", "text_config") if isinstance(config.get(k), dict)]
    found = [s["max_position_embeddings"] for s in sections if isinstance(s.get("max_position_embeddings"), int)]
    if not found:
        c.error("context", "model.bf16", f"{path}/config.json has no max_position_embeddings: verl's vLLM rollout "
                "refuses the model when the rollout starts; use a complete Hugging Face config.json")
        return
    rope = config.get("rope_scaling")
    factor = rope.get("factor", 1) if isinstance(rope, dict) and isinstance(rope.get("factor"), (int, float)) else 1
    context = int(found[0] * factor)
    if context < prompt + response:
        scaled = f" x rope_scaling factor {factor}" if factor != 1 else ""
        c.error("context", verl_field(spec, "data.max_response_length"),
                f"max_prompt_length {prompt} + max_response_length {response} = {prompt + response} tokens exceed "
                f"the model's context of {context} (max_position_embeddings {found[0]}{scaled}, {path}/config.json): "
                "verl's vLLM rollout refuses it when the rollout starts; shorten them or use a longer-context model")


# int8 entries a sampled verify-quant checks (spread over the model): a profile of another checkpoint fails
PROFILE_SAMPLE = 4


def _check_profile(c: Collector, spec: RunSpec) -> None:
    profile_path = spec.model.profile_path
    field = "model.profile"
    if profile_path and profile_path.is_dir():
        c.error("profile", field, f"{profile_path} is a directory; model.profile is the profile file "
                "(`rollout8 profile -o FILE.pt`)")
        return
    if not (profile_path and profile_path.is_file() and spec.model.int8.is_dir()):
        return  # reported by check_paths, or not on this machine
    try:
        import torch
    except ImportError:
        c.info("profile", field, "torch is not installed here: profile not compared with the int8 model")
        return
    from ..quant.checkpoint import Checkpoint

    try:
        ckpt = Checkpoint(spec.model.int8)
    except ModelError as exc:
        c.error("profile", "model.int8", str(exc))
        return
    from ..quant.verify import load_profile, verify

    try:
        profile = load_profile(profile_path)
    except ModelError as exc:  # not loadable, not a profile, or an entry of the wrong kind
        c.error("profile", field, str(exc))
        return
    quantized = ckpt.int8_weights()
    in_profile_int8 = {n for n, v in profile.items() if v["type"] == torch.int8}
    missing = quantized - in_profile_int8
    extra = set(profile) - set(ckpt.tensors)
    remake = f"; re-run `rollout8 profile` for {spec.model.int8}"
    if missing:
        c.error("profile", field, f"{len(missing)} int8 weight(s) of the int8 model are not in the profile"
                f"{_layers(missing)}: {_sample(missing)}{remake}")
    if extra:
        c.error("profile", field, f"{len(extra)} profile entr(ies) name tensors the int8 model does not have"
                f"{_layers(extra)}: {_sample(extra)}{remake}")
    wrong_type = {n for n in in_profile_int8 & set(ckpt.tensors) if n not in quantized}
    if wrong_type:
        c.error("profile", field, f"{len(wrong_type)} entr(ies) quantize to int8 tensors that are not int8 in the "
                f"model: {_sample(wrong_type)}{remake}")
    bad_shape = []
    for name, entry in sorted(profile.items()):
        info = ckpt.tensors.get(name)
        if info is None:
            continue
        shape = info.shape
        out_n, in_n = (shape[0], shape[-1]) if len(shape) >= 2 else (shape[0], shape[0])
        o, i = _numel(entry["output_scale"]), _numel(entry["input_scale"])
        if len(shape) >= 2:
            if o not in (1, out_n) or i not in (1, in_n):
                bad_shape.append(f"{name} {list(shape)}: output_scale {o}, input_scale {i}")
        elif i not in (1, out_n):
            bad_shape.append(f"{name} {list(shape)}: input_scale {i}")
    if bad_shape:
        c.error("profile", field, f"{len(bad_shape)} entr(ies) have scales whose shapes do not fit the model: "
                + "; ".join(bad_shape[:3]) + remake)
    bad_scale = sorted(name for name, entry in profile.items() for key in ("input_scale", "output_scale")
                       if torch.is_tensor(entry[key]) and entry[key].is_floating_point()
                       and not bool((torch.isfinite(entry[key]) & (entry[key] != 0)).all()))
    if bad_scale:
        c.error("profile", field, f"{len(bad_scale)} entr(ies) have NaN, infinite or zero scales, e.g. "
                f"{bad_scale[0]}: FlashRL would write garbage weights at every sync{remake}")
    if missing or extra or wrong_type or bad_shape or bad_scale or not spec.model.bf16.is_dir():
        return

    try:
        report = verify(spec.model.bf16, spec.model.int8, profile_path, sample=PROFILE_SAMPLE)
    except ModelError as exc:
        c.error("profile", field, str(exc))
        return
    if not report.passed:
        worst = report.failures[0]
        c.error("profile", field, f"a sampled verify-quant fails ({len(report.failures)} of {len(report.rows)} "
                f"entries, e.g. {worst.name}: {worst.message}): the profile, the bf16 model and the int8 model are "
                f"not of one checkpoint; re-run `rollout8 profile -m {spec.model.bf16} -q {spec.model.int8}`")
