"""One view of an int8 (W8A8) checkpoint, whichever of the two supported layouts it is written in.

The two layouts
- ``compressed-tensors`` (public W8A8 checkpoints such as RedHatAI/Qwen2.5-7B-quantized.w8a8, and what
  `rollout8 make-test-model` writes): config.json carries ``quantization_config`` with quant_method
  compressed-tensors, format int-quantized (or naive-quantized); each quantized Linear has ``weight`` int8
  [out, in] and ``weight_scale`` [out, 1] (channel-wise symmetric, no zero point), activations int8 dynamic per
  token.
- ``ascend`` (the msModelSlim layout vllm-ascend 7e16b4a loads with ``quantization="ascend"``; what
  `rollout8 convert --to ascend` writes): no ``quantization_config`` in config.json, a
  ``quant_model_description.json`` keyed per tensor name; a quantized Linear is ``W8A8_DYNAMIC`` with ``weight``
  int8 [out, in], ``weight_scale`` and ``weight_offset`` [out, 1]. vllm-ascend's W8A8_DYNAMIC ``apply`` passes only
  the weight and ``weight_scale`` to ``npu_quant_matmul`` (the offset is never read), so the dequantized weight is
  ``int8 * weight_scale`` in both layouts.

Everything else (embeddings, norms, biases, lm_head) has the same HF name and value in both layouts, so the
profile and verify-quant work on either through this module: `open_quantized(dir)` gives per Linear (by its HF
module prefix, e.g. ``model.layers.0.self_attn.q_proj``) the int8 weight [out, in] and the per-channel scale
[out, 1], and every other tensor by its name, streaming shard by shard.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError
from .checkpoint import Checkpoint, read_json

COMPRESSED_TENSORS = "compressed-tensors"
ASCEND = "ascend"
ASCEND_DESCRIPTION_FILE = "quant_model_description.json"
W8A8_DYNAMIC = "W8A8_DYNAMIC"
FLOAT = "FLOAT"

# compressed-tensors formats whose quantized weights are stored as plain int8 [out, in] (no bit packing).
INT8_FORMATS = ("int-quantized", "naive-quantized")

# config.json keys that mark a mixture-of-experts model (FlashRL's profile covers dense layers only: trap 10).
MOE_CONFIG_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
_EXPERT_NAME = re.compile(r"\.experts?\.|\.shared_experts?\.|\.block_sparse_moe\.")


@dataclass(frozen=True)
class QuantLinear:
    """One quantized Linear: tensor names and shape ([out, in] as stored)."""

    prefix: str  # HF module name, e.g. model.layers.0.self_attn.q_proj
    out_features: int
    in_features: int
    scale_dtype: str  # safetensors dtype of the stored scale (BF16, F16, F32)

    @property
    def weight_name(self) -> str:
        return self.prefix + ".weight"

    @property
    def scale_name(self) -> str:
        return self.prefix + ".weight_scale"


def detect_layout(directory: str | Path) -> str:
    """``ascend`` if the directory has a quant_model_description.json, ``compressed-tensors`` if its config.json
    says so; anything else is refused with what was found."""
    d = Path(directory)
    if (d / ASCEND_DESCRIPTION_FILE).is_file():
        return ASCEND
    config_path = d / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{d}: config.json is missing (not a model directory?)")
    qc = _quantization_config(read_json(config_path, "config.json"))
    if qc is None:
        raise ModelError(f"{d}: not an int8 model: config.json has no quantization_config and there is no "
                         f"{ASCEND_DESCRIPTION_FILE} (give the W8A8 checkpoint, not the bf16 one)")
    method = str(qc.get("quant_method", "")).lower().replace("_", "-")
    if method == COMPRESSED_TENSORS:
        return COMPRESSED_TENSORS
    raise ModelError(f"{d}: config.json quantization_config.quant_method is {qc.get('quant_method')!r}; supported: "
                     f"'compressed-tensors' (W8A8 int8) or the vllm-ascend layout with {ASCEND_DESCRIPTION_FILE}")


def _quantization_config(config: dict) -> dict | None:
    qc = config.get("quantization_config")
    if qc is None:
        qc = config.get("compression_config")
    return qc


def refuse_moe(config: dict, names, where: str) -> None:
    """Raise for mixture-of-experts models: FlashRL's int8 profile does not cover expert weights (trap 10)."""
    keys = [k for k in MOE_CONFIG_KEYS if config.get(k)]
    experts = next((n for n in names if _EXPERT_NAME.search(n)), None)
    if keys or experts:
        found = f"config.json {', '.join(keys)}" if keys else f"tensor {experts}"
        raise ModelError(f"{where}: mixture-of-experts model ({found}); int8 rollout supports dense models only "
                         f"(FlashRL's profile does not requantize expert weights)")


def check_compressed_tensors_scheme(qc: dict, where: str) -> None:
    """Accept only W8A8 int8: weights 8-bit int channel-wise symmetric static, activations 8-bit int per-token
    symmetric dynamic, no output activations, no kv-cache scheme. Name the offending field otherwise."""
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if not groups:
        raise ModelError(f"{where}: quantization_config.config_groups is empty: not a W8A8 checkpoint")
    if qc.get("kv_cache_scheme"):
        raise ModelError(f"{where}: quantization_config.kv_cache_scheme is set; int8 kv-cache is not supported "
                         f"(remove it or use a W8A8 checkpoint without it)")
    for gname, group in groups.items():
        field = f"quantization_config.config_groups.{gname}"
        gfmt = group.get("format") or fmt
        if gfmt not in INT8_FORMATS:
            raise ModelError(f"{where}: {field} format is {gfmt!r}; supported: {', '.join(INT8_FORMATS)} "
                             f"(int8 weights stored unpacked)")
        w = group.get("weights") or {}
        want_w = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}
        for key, want in want_w.items():
            if w.get(key) != want:
                raise ModelError(f"{where}: {field}.weights.{key} is {w.get(key)!r}, need {want!r} "
                                 f"(W8A8 int8: channel-wise symmetric int8 weights)")
        if w.get("dynamic"):
            raise ModelError(f"{where}: {field}.weights.dynamic is true; need static (stored) weight scales")
        a = group.get("input_activations")
        if not a:
            raise ModelError(f"{where}: {field}.input_activations is missing: weight-only (W8A16) checkpoints "
                             f"are not supported; need W8A8 with dynamic per-token int8 activations")
        want_a = {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True}
        for key, want in want_a.items():
            if a.get(key) != want:
                raise ModelError(f"{where}: {field}.input_activations.{key} is {a.get(key)!r}, need {want!r} "
                                 f"(vllm-ascend's W8A8_DYNAMIC quantizes activations per token at run time)")
        if group.get("output_activations"):
            raise ModelError(f"{where}: {field}.output_activations is set; not supported")


class QuantizedModel:
    """An int8 checkpoint in either layout. Cheap to open: only headers and JSON files are read."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.layout = detect_layout(self.dir)
        self.checkpoint = Checkpoint(self.dir)
        self.config = self.checkpoint.config
        self.description: dict | None = None
        where = str(self.dir)
        refuse_moe(self.config, self.checkpoint.names(), where)
        if self.layout == COMPRESSED_TENSORS:
            check_compressed_tensors_scheme(_quantization_config(self.config), where)
            prefixes = self._ct_linears()
        else:
            self.description = read_json(self.dir / ASCEND_DESCRIPTION_FILE, ASCEND_DESCRIPTION_FILE)
            prefixes = self._ascend_linears()
        self.linears: dict[str, QuantLinear] = {}
        for prefix in prefixes:
            w = self.checkpoint.tensors[prefix + ".weight"]
            s = self.checkpoint.tensors.get(prefix + ".weight_scale")
            if s is None:
                raise ModelError(f"{where}: {prefix}.weight is int8 but {prefix}.weight_scale is missing")
            if len(w.shape) != 2:
                raise ModelError(f"{where}: {prefix}.weight has shape {list(w.shape)}; expected [out, in]")
            if s.shape not in ((w.shape[0], 1), (w.shape[0],)):
                raise ModelError(f"{where}: {prefix}.weight_scale has shape {list(s.shape)}; expected "
                                 f"[{w.shape[0]}, 1] (one scale per output channel)")
            self.linears[prefix] = QuantLinear(prefix, w.shape[0], w.shape[1], s.dtype)
        if not self.linears:
            raise ModelError(f"{where}: no int8 linear weights found")

    # -------------------------------------------------------------------------------- discovery
    def _ct_linears(self) -> list[str]:
        where = str(self.dir)
        out = []
        for name, info in self.checkpoint.tensors.items():
            if name.endswith(".weight_zero_point"):
                continue  # checked for zeros when read (symmetric)
            if name.endswith((".input_scale", ".input_zero_point", ".output_scale")):
                raise ModelError(f"{where}: {name} present: static activation quantization is not supported "
                                 f"(need dynamic per-token activations)")
            if name.endswith(".weight") and info.dtype == "I8":
                out.append(name[: -len(".weight")])
            elif name.endswith(".weight_packed"):
                raise ModelError(f"{where}: {name}: packed (sub-8-bit) weights are not supported; need int8")
        return out

    def _ascend_linears(self) -> list[str]:
        where = f"{self.dir / ASCEND_DESCRIPTION_FILE}"
        out = []
        for key, kind in self.description.items():
            if not key.endswith(".weight") or not isinstance(kind, str):
                continue
            if kind == FLOAT:
                continue
            if kind != W8A8_DYNAMIC:
                raise ModelError(f"{where}: {key} is {kind!r}; only {W8A8_DYNAMIC} (and {FLOAT}) are supported "
                                 f"for int8 rollout")
            if key not in self.checkpoint:
                raise ModelError(f"{where}: {key} is described as {W8A8_DYNAMIC} but the checkpoint has no such "
                                 f"tensor")
            if self.checkpoint.tensors[key].dtype != "I8":
                raise ModelError(f"{where}: {key} is {W8A8_DYNAMIC} but stored as "
                                 f"{self.checkpoint.tensors[key].dtype}, not int8")
            out.append(key[: -len(".weight")])
        for name, info in self.checkpoint.tensors.items():
            if name.endswith(".weight") and info.dtype == "I8" and name[: -len(".weight")] not in out:
                raise ModelError(f"{where}: {name} is int8 but not described as {W8A8_DYNAMIC}")
        return out

    # -------------------------------------------------------------------------------- access
    def is_quantized(self, prefix: str) -> bool:
        return prefix in self.linears

    def quant_tensor_names(self) -> set[str]:
        """Names of the tensors that belong to the quantization (weights, scales, offsets, zero points)."""
        names = set()
        for p in self.linears:
            for suffix in (".weight", ".weight_scale", ".weight_offset", ".weight_zero_point"):
                if p + suffix in self.checkpoint:
                    names.add(p + suffix)
        return names

    def float_names(self) -> list[str]:
        """Every tensor that is not part of a quantized Linear's int8 weight/scale/offset (norms, embeddings,
        biases, lm_head): same names and values in both layouts."""
        skip = self.quant_tensor_names()
        return [n for n in self.checkpoint.names() if n not in skip]

    def get(self, name: str):
        """A non-quantized tensor (norm, embedding, bias, lm_head) by its HF name."""
        return self.checkpoint.get(name)

    def int8_weight(self, prefix: str):
        self._require(prefix)
        return self.checkpoint.get(prefix + ".weight")

    def weight_scale(self, prefix: str):
        """The per-output-channel scale as stored, viewed as [out, 1]."""
        self._require(prefix)
        scale = self.checkpoint.get(prefix + ".weight_scale")
        return scale.reshape(-1, 1)

    def dequantized(self, prefix: str):
        """int8 * scale in float32 (what both vLLM's compressed-tensors path and vllm-ascend's W8A8_DYNAMIC
        compute, up to the matmul's own rounding)."""
        import torch

        return self.int8_weight(prefix).to(torch.float32) * self.weight_scale(prefix).to(torch.float32)

    def iter_linears(self) -> Iterator[tuple[str, object, object]]:
        """(prefix, int8 weight [out, in], scale [out, 1]) for every quantized Linear, shard by shard."""
        wanted = []
        for p in self.linears:
            wanted += [p + ".weight", p + ".weight_scale"]
            if p + ".weight_zero_point" in self.checkpoint:
                wanted.append(p + ".weight_zero_point")
        pending: dict[str, dict] = {}
        for name, tensor in self.checkpoint.iter_tensors(wanted):
            prefix, _, leaf = name.rpartition(".")
            parts = pending.setdefault(prefix, {})
            parts[leaf] = tensor
            need = {"weight", "weight_scale"} | ({"weight_zero_point"}
                                                  if prefix + ".weight_zero_point" in self.checkpoint else set())
            if need <= parts.keys():
                del pending[prefix]
                if "weight_zero_point" in parts:
                    self._check_zero_point(prefix, parts["weight_zero_point"])
                yield prefix, parts["weight"], parts["weight_scale"].reshape(-1, 1)
        if pending:  # weight and scale in different shards: read the leftovers directly
            for prefix in pending:
                yield prefix, self.int8_weight(prefix), self.weight_scale(prefix)

    def _check_zero_point(self, prefix: str, zp) -> None:
        if bool((zp != 0).any()):
            raise ModelError(f"{self.dir}: {prefix}.weight_zero_point has non-zero entries: asymmetric weights "
                             f"are not supported (need symmetric int8)")

    def _require(self, prefix: str) -> None:
        if prefix not in self.linears:
            raise ModelError(f"{self.dir}: {prefix} is not a quantized linear of this checkpoint")


def open_quantized(directory: str | Path) -> QuantizedModel:
    """Open an int8 checkpoint in the compressed-tensors or the ascend layout (see the module docstring)."""
    return QuantizedModel(directory)


def flashrl_entry_fields(layout: str) -> dict:
    """Extra keys for a FlashRL int8 config entry whose model is in `layout` (no disk access: node paths work).

    An ascend-layout model loads on vllm-ascend 7e16b4a only with ``quantization="ascend"``: its config.json has no
    quantization_config, so nothing else selects the method (without it vLLM builds an unquantized model and
    fails on the unknown ``weight_scale`` tensors). FlashRL passes an entry's ``quantization`` key to
    ``vllm.LLM`` (keys_to_overload in flash_rl/vllm_patch.py). ``weight_scale_fp32`` is a plain tensor attribute
    that W8A8_DYNAMIC's post-load step derives from ``weight_scale``; FlashRL's reload re-runs that step on a
    freshly allocated, never-loaded ``weight_scale``, so it is kept across reloads with
    ``module_attribute_to_preserve`` (Qwen2 does not read it, DeepSeek's MLP does).
    compressed-tensors models need nothing extra (vLLM reads the method from config.json).
    """
    if layout == ASCEND:
        return {"quantization": ASCEND, "module_attribute_to_preserve": ["weight_scale_fp32"]}
    if layout == COMPRESSED_TENSORS:
        return {}
    raise ModelError(f"unknown int8 model layout {layout!r} ({COMPRESSED_TENSORS} or {ASCEND})")


def flashrl_overrides(int8_dir: str | Path) -> dict:
    """flashrl_entry_fields for the layout of the model in `int8_dir`."""
    return flashrl_entry_fields(detect_layout(int8_dir))
