"""`rollout8 convert --to ascend INT8_DIR OUT_DIR`: a compressed-tensors W8A8 checkpoint -> the W8A8_DYNAMIC layout
that vllm-ascend 7e16b4a (v0.10.1rc1) loads natively with ``quantization="ascend"``. Lossless and streaming.

What vllm-ascend 7e16b4a (the `git.vllm-ascend` pin of versions.lock.yaml) reads (from its source at that commit)
- ``vllm_ascend/quantization/quant_config.py``: ``AscendQuantConfig`` is registered as quantization method
  ``"ascend"``; ``get_config_filenames()`` is ``["quant_model_description.json"]`` and ``from_config(d)`` keeps the
  whole dict as ``quant_description``. vLLM's ``get_quant_config`` uses config.json's ``quantization_config`` (or
  ``compression_config``) *instead of* that file when one is present, so config.json must have neither: otherwise
  the compressed-tensors dict becomes the description and loading fails with
  ``KeyError: 'model.layers.0.self_attn.q_proj.weight'`` (trap 6). Without it, vLLM globs ``*.json`` in the model
  directory and needs exactly one file ending in ``quant_model_description.json``.
- Nothing selects "ascend" automatically then: ``vllm.LLM(..., quantization="ascend")`` (FlashRL: a
  ``quantization: ascend`` key in the config entry, see `rollout8.quant.layout.flashrl_overrides`). Its
  ``override_quantization_method`` only fires when config.json *has* a quantization_config.
- ``get_quant_method``: every ``LinearBase`` and every ``VocabParallelEmbedding`` (``model.embed_tokens``,
  ``lm_head``) looks up ``quant_description[prefix + ".weight"]``: ``"FLOAT"`` -> unquantized method, anything else
  -> ``AscendQuantizer``. Fused layers (``qkv_proj``, ``gate_up_proj``) look up each shard (q/k/v, gate/up) via
  the model's ``packed_modules_mapping``; shards must agree (``ValueError`` otherwise). A missing key is a
  ``KeyError``, so the description must cover every Linear's and embedding's ``.weight`` - ``lm_head.weight``
  included even when it is tied to the embeddings. Top-level ``fa_quant_type`` / ``kv_quant_type`` would switch
  attention quantization on: not written.
- ``vllm_ascend/quantization/quantizer.py``: ``"W8A8_DYNAMIC"`` -> ``W8A8DYNAMICQuantizer`` ->
  ``AscendW8A8DynamicLinearMethod``. A description key containing ``norm.bias`` would patch RMSNorm (anti-outlier
  static W8A8 only): none is written.
- ``vllm_ascend/quantization/w8a8_dynamic.py``, ``AscendW8A8DynamicLinearMethod`` creates ``weight`` int8
  [out, in] (``get_weight``), ``weight_scale`` and ``weight_offset`` [out, 1] in ``params_dtype`` (the model dtype,
  config.json ``torch_dtype``; ``get_perchannel_param``), no per-tensor or per-group parameters. ``apply`` quantizes
  activations per token (``npu_dynamic_quant``) and calls ``npu_quant_matmul(x, weight, weight_scale,
  pertoken_scale, bias)``: ``weight_offset`` is never read (zeros here). ``process_weights_after_loading``
  transposes the weight to [in, out], casts it to the NZ format (29), flattens scale and offset and adds
  ``weight_scale_fp32``.
- ``tests/e2e/singlecard/test_quantization.py`` loads an msModelSlim Qwen2.5 W8A8 model the same way, with
  ``quantization="ascend"`` (no quantization_config in its config.json).

What this command writes (OUT_DIR)
- safetensors shards named like the source's (plus ``model.safetensors.index.json`` when sharded): for each
  quantized Linear ``<prefix>.weight`` int8 [out, in] (bytes unchanged), ``<prefix>.weight_scale`` [out, 1] and
  ``<prefix>.weight_offset`` [out, 1] (zeros) in the model dtype; every other tensor byte for byte.
- ``quant_model_description.json``: ``model_quant_type: W8A8_DYNAMIC``, ``version: 1.0.0`` (msModelSlim's top-level
  keys; vllm-ascend 7e16b4a reads neither) and one entry per tensor: ``W8A8_DYNAMIC`` for a quantized Linear's
  weight/scale/offset, ``FLOAT`` for everything else, plus ``lm_head.weight: FLOAT`` if the head is tied.
- config.json without ``quantization_config`` / ``compression_config``; tokenizer and every other file copied.
- ``rollout8-convert.json``: what was converted from what (makes re-runs idempotent).

Lossless: the source's scales must be exactly representable in the model dtype (vllm-ascend stores them in
params_dtype whatever the file says). compressed-tensors writes them in the model dtype, so this holds for
RedHatAI-style checkpoints; a float32 scale that is not is refused unless ``--round-scales`` is given. After
writing, every Linear's dequantized weight (int8 * scale) is compared with the source's (``--no-verify`` skips).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelError
from ..fileutil import sha256_bytes, staged_dir
from .checkpoint import INDEX_FILE, SINGLE_FILE, Checkpoint
from .layout import (
    ASCEND,
    ASCEND_DESCRIPTION_FILE,
    COMPRESSED_TENSORS,
    FLOAT,
    W8A8_DYNAMIC,
    open_quantized,
)

MANIFEST_FILE = "rollout8-convert.json"
CONVERTER_VERSION = "1"
DESCRIPTION_TOP_LEVEL = {"model_quant_type": W8A8_DYNAMIC, "version": "1.0.0"}
SUPPORTED_DTYPES = {"bfloat16": "BF16", "float16": "F16"}


@dataclass
class ConversionResult:
    out_dir: Path
    quantized: list[str] = field(default_factory=list)  # Linear prefixes written as W8A8_DYNAMIC
    floats: list[str] = field(default_factory=list)  # tensors copied as they are
    rounded_scales: int = 0  # scales that changed when cast to the model dtype (only with round_scales)
    max_scale_rel_change: float = 0.0
    verified: bool = False
    skipped: bool = False  # an identical conversion was already there


def model_dtype(config: dict, where: str):
    """The params_dtype vllm-ascend creates weight_scale/weight_offset in: config.json's torch_dtype."""
    import torch

    name = config.get("torch_dtype") or config.get("dtype")
    if name not in SUPPORTED_DTYPES:
        raise ModelError(f"{where}: config.json torch_dtype is {name!r}; need one of {', '.join(SUPPORTED_DTYPES)} "
                         f"(the dtype vllm-ascend uses for weight_scale)")
    return getattr(torch, name)


def source_fingerprint(ckpt: Checkpoint) -> str:
    """Changes when any source tensor's name/dtype/shape or any shard file's size/mtime changes."""
    lines = [f"{name}|{info.dtype}|{info.shape}\n" for name, info in sorted(ckpt.tensors.items())]
    for shard in sorted({i.file for i in ckpt.tensors.values()}):
        st = shard.stat()
        lines.append(f"{shard.name}|{st.st_size}|{st.st_mtime_ns}\n")
    return sha256_bytes("".join(lines).encode() + (ckpt.dir / "config.json").read_bytes())


def ascend_config(config: dict) -> dict:
    """config.json as vllm-ascend 7e16b4a needs it: no quantization_config / compression_config (see above)."""
    return {k: v for k, v in config.items() if k not in ("quantization_config", "compression_config")}


def check_fused_consistency(quantized: set[str], linear_prefixes: set[str], where: str) -> None:
    """vllm-ascend raises ValueError when only some shards of a fused layer (q/k/v, gate/up) are quantized."""
    fused = {"q_proj": ("q_proj", "k_proj", "v_proj"), "gate_proj": ("gate_proj", "up_proj")}
    for prefix in linear_prefixes:
        head, _, leaf = prefix.rpartition(".")
        if leaf not in fused:
            continue
        members = [f"{head}.{m}" for m in fused[leaf]]
        states = {m: m in quantized for m in members if m in linear_prefixes}
        if len(set(states.values())) > 1:
            q = [m for m, s in states.items() if s]
            raise ModelError(f"{where}: only some shards of a fused layer are int8 ({', '.join(q)}; not the rest "
                             f"of {', '.join(states)}); vllm-ascend needs all or none")


def description_for(names: list[str], quantized: list[str], linear_like: set[str]) -> dict:
    """quant_model_description.json: top-level keys, then one entry per tensor (sorted), lm_head.weight always."""
    desc = dict(DESCRIPTION_TOP_LEVEL)
    qnames = set()
    for p in quantized:
        qnames |= {p + ".weight", p + ".weight_scale", p + ".weight_offset"}
    entries = {n: (W8A8_DYNAMIC if n in qnames else FLOAT) for n in names}
    for p in linear_like:  # every Linear's and embedding's .weight must be a key (KeyError otherwise)
        entries.setdefault(p + ".weight", FLOAT)
    entries.setdefault("lm_head.weight", FLOAT)
    desc.update(dict(sorted(entries.items())))
    return desc


def _cast_scale(scale, dtype, prefix: str, where: str, round_scales: bool, result: ConversionResult):
    import torch

    cast = scale.reshape(-1, 1).to(dtype)
    if scale.dtype == dtype:
        return cast.contiguous()
    back = cast.to(scale.dtype).reshape(scale.shape)
    if torch.equal(back, scale):
        return cast.contiguous()
    rel = ((back.double() - scale.double()).abs() / scale.double().abs().clamp(min=1e-30)).max().item()
    if not round_scales:
        raise ModelError(f"{where}: {prefix}.weight_scale is {scale.dtype} and not exactly representable in {dtype} "
                         f"(max relative change {rel:.2e}); vllm-ascend keeps weight_scale in the model dtype, so the "
                         f"int8 model it runs would differ from this checkpoint. Pass --round-scales to accept that "
                         f"(then recompute the profile from the converted model)")
    result.rounded_scales += int((back != scale).sum().item())
    result.max_scale_rel_change = max(result.max_scale_rel_change, rel)
    return cast.contiguous()


def convert_to_ascend(int8_dir: str | Path, out_dir: str | Path, *, round_scales: bool = False,
                      verify: bool = True, force: bool = False, progress=print) -> ConversionResult:
    """Convert a compressed-tensors W8A8 checkpoint to the vllm-ascend W8A8_DYNAMIC layout (module docstring).

    Streams shard by shard (one output shard in memory at a time); writes into a temporary sibling directory and
    renames it into place at the end, so a failure leaves nothing half-written. Re-running with the same source
    is a no-op; a different existing OUT_DIR is refused unless force."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = Path(int8_dir).resolve()
    out = Path(out_dir).resolve()
    progress = progress or (lambda _msg: None)
    if src == out or out in src.parents or src in out.parents:
        raise ModelError(f"{out}: the output directory must be separate from the source {src}")
    model = open_quantized(src)
    where = str(src)
    if model.layout == ASCEND:
        raise ModelError(f"{src}: already in the ascend layout ({ASCEND_DESCRIPTION_FILE} present); nothing to convert")
    assert model.layout == COMPRESSED_TENSORS
    ckpt = model.checkpoint
    dtype = model_dtype(model.config, where)
    fingerprint = source_fingerprint(ckpt)
    manifest = {"converter": CONVERTER_VERSION, "to": ASCEND, "source": str(src), "source_fingerprint": fingerprint,
                "round_scales": round_scales}

    result = ConversionResult(out_dir=out)
    if out.exists():
        old = out / MANIFEST_FILE
        if old.is_file() and _same_conversion(json.loads(old.read_text()), manifest):
            progress(f"{out}: already converted from this source; nothing to do")
            result.skipped = True
            result.quantized = sorted(model.linears)
            return result
        if any(out.iterdir()) and not force:
            raise ModelError(f"{out}: exists and is not a conversion of {src}; remove it or pass --force")

    quantized = sorted(model.linears)
    heads = [p for p in quantized if p.rpartition(".")[2] in ("lm_head", "embed_tokens")]
    if heads:
        raise ModelError(f"{where}: {heads[0]} is int8; FlashRL's profile never requantizes lm_head or the "
                         f"embeddings, so a weight sync would load bf16 values into it. Use a W8A8 checkpoint with "
                         f"them in quantization_config.ignore")
    linear_like = _linear_like_prefixes(ckpt.names())
    check_fused_consistency(set(quantized), linear_like | set(quantized), where)

    with staged_dir(out) as tmp:
        shards = sorted({i.file for i in ckpt.tensors.values()})
        weight_map: dict[str, str] = {}
        total = 0
        out_names: list[str] = []
        qset = set(quantized)
        for k, shard in enumerate(shards):
            progress(f"shard {k + 1}/{len(shards)}: {shard.name}")
            tensors = {}
            with safe_open(str(shard), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    prefix, _, leaf = name.rpartition(".")
                    t = fh.get_tensor(name)
                    if prefix in qset and leaf == "weight_zero_point":
                        if bool((t != 0).any()):
                            raise ModelError(f"{where}: {name} has non-zero entries: asymmetric int8 weights are not "
                                             f"supported by W8A8_DYNAMIC")
                        continue
                    if prefix in qset and leaf == "weight_scale":
                        tensors[name] = _cast_scale(t, dtype, prefix, where, round_scales, result)
                        tensors[prefix + ".weight_offset"] = torch.zeros_like(tensors[name])
                    elif prefix in qset and leaf == "weight":
                        tensors[name] = t.contiguous()
                    else:
                        tensors[name] = t
                        result.floats.append(name)
            target = shard.name if len(shards) > 1 else SINGLE_FILE
            save_file(tensors, str(tmp / target), metadata={"format": "pt"})
            total += (tmp / target).stat().st_size
            for name in tensors:
                weight_map[name] = target
            out_names += list(tensors)
            del tensors
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")

        missing = [p for p in quantized if p + ".weight_offset" not in weight_map]
        if missing:
            raise ModelError(f"{where}: no weight_scale written for {', '.join(missing[:3])}")
        desc = description_for(out_names, quantized, linear_like)
        (tmp / ASCEND_DESCRIPTION_FILE).write_text(json.dumps(desc, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(ascend_config(model.config), indent=2) + "\n")
        copied = _copy_other_files(src, tmp)
        progress(f"copied {len(copied)} tokenizer/config file(s): {', '.join(copied) or 'none'}")

        result.quantized = quantized
        manifest.update({"quantized_linears": len(quantized), "rounded_scales": result.rounded_scales})
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        if verify:
            progress("verifying: dequantized weights of every linear against the source")
            compare_dequantized(src, tmp, exact=not round_scales)
            result.verified = True
    return result


def _same_conversion(old: dict, new: dict) -> bool:
    keys = ("converter", "to", "source_fingerprint", "round_scales")
    return all(old.get(k) == new.get(k) for k in keys)


def _linear_like_prefixes(names: list[str]) -> set[str]:
    """Module prefixes vllm-ascend will look up: Linear layers of a dense decoder and the embeddings/head."""
    leaves = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens", "lm_head")
    out = set()
    for n in names:
        if n.endswith(".weight"):
            prefix = n[: -len(".weight")]
            if prefix.rpartition(".")[2] in leaves:
                out.add(prefix)
    return out


def _copy_other_files(src: Path, dst: Path) -> list[str]:
    """Tokenizer, generation config, chat template, custom code...: everything but weights and the rewritten JSONs."""
    skip = {"config.json", INDEX_FILE, MANIFEST_FILE, ASCEND_DESCRIPTION_FILE, "recipe.yaml"}
    copied = []
    for path in sorted(src.iterdir()):
        if not path.is_file() or path.name in skip or path.suffix == ".safetensors":
            continue
        if path.name.endswith(ASCEND_DESCRIPTION_FILE):
            continue  # vLLM would find two description files
        shutil.copy2(path, dst / path.name)
        copied.append(path.name)
    return copied


def compare_dequantized(a_dir: str | Path, b_dir: str | Path, *, exact: bool = True) -> int:
    """Compare int8 * scale of every Linear, and every other tensor, between two int8 checkpoints of either layout.
    Raises ModelError on the first difference; returns the number of linears compared."""
    import torch

    a, b = open_quantized(a_dir), open_quantized(b_dir)
    if set(a.linears) != set(b.linears):
        only = sorted(set(a.linears) ^ set(b.linears))
        raise ModelError(f"{b.dir}: quantized linears differ from {a.dir}: {', '.join(only[:5])}")
    n = 0
    for prefix, w, s in a.iter_linears():
        da = w.to(torch.float32) * s.to(torch.float32)
        db = b.dequantized(prefix)
        if da.shape != db.shape:
            raise ModelError(f"{b.dir}: {prefix} shape {list(db.shape)} != {list(da.shape)} in {a.dir}")
        if exact and not torch.equal(da, db):
            diff = (da - db).abs().max().item()
            raise ModelError(f"{b.dir}: {prefix} dequantized weight differs from {a.dir} (max abs diff {diff:.3e})")
        if not torch.equal(w, b.int8_weight(prefix)):
            raise ModelError(f"{b.dir}: {prefix}.weight int8 values differ from {a.dir}")
        n += 1
    fa, fb = set(a.float_names()), set(b.float_names())
    if fa != fb:
        raise ModelError(f"{b.dir}: non-quantized tensors differ from {a.dir}: {', '.join(sorted(fa ^ fb)[:5])}")
    for name, t in a.checkpoint.iter_tensors(sorted(fa)):
        if not torch.equal(t, b.get(name)):
            raise ModelError(f"{b.dir}: {name} differs from {a.dir}")
    return n


# ------------------------------------------------------------------------------------------------ CLI
