"""`rollout8 profile`: FlashRL's int8 profile, computed by streaming both checkpoints one decoder layer at a time.

`flashrl profile --fn int8` loads the bf16 model (as float32) and the W8A8 model fully with transformers: about
5.5 bytes of host RAM per parameter. This computes the same dict from the safetensors files, holding one
layer's tensors at a time, and without importing transformers.

The profile (keys are the bf16 model's HF parameter names), as FlashRL 1.0.3 defines it:
  - norms (input_layernorm, post_attention_layernorm): input_scale = qLN / LN, output_scale 1.0,
    type = the dtype the quantized model's norm had when FlashRL loaded it;
  - q/k/v and gate (smoothed by a norm): input_scale = 1 / (qLN / LN) as [1, in], output_scale = 1 / weight_scale;
  - up: additionally a per-row factor beta fitted by least squares between W * (LN / qLN) / weight_scale and the
    int8 weight; output_scale = 1 / (weight_scale / beta);
  - down: input_scale = 1 / beta as [1, intermediate], output_scale = 1 / weight_scale;
  - o: input_scale 1.0, output_scale = 1 / weight_scale.
Float details reproduced on purpose, so the result equals FlashRL's: the bf16 model is read as float32, and the
quantized model's non-int8 tensors (norms, weight scales) go through float16, the dtype transformers'
compressed-tensors quantizer loads them in when no dtype is given (which is how FlashRL calls it).
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

from ..errors import ModelError
from ..fileutil import atomic_write
from . import quantmath
from .checkpoint import Checkpoint
from .layout import open_quantized

# The dtype FlashRL's transformers load gives the quantized model's floating tensors (see module docstring).
QUANTIZED_LOAD_DTYPE = "float16"
UNSUPPORTED_MARKERS = ("experts", "shared_expert", "q_norm", "k_norm")


# What an existing `-o` file must be to be replaced without --force: torch.save's zip container.
PROFILE_KIND = ("a FlashRL profile", zipfile.is_zipfile)


def _layer_names(i: int) -> dict[str, str]:
    p = f"model.layers.{i}."
    names = {norm: p + norm + ".weight" for norm in quantmath.NORMS}
    names.update({lin: p + lin + ".weight" for lin in quantmath.LINEARS})
    return names


def _num_layers(ckpt: Checkpoint) -> int:
    n = ckpt.config.get("num_hidden_layers")
    if not isinstance(n, int) or n < 1:
        raise ModelError(f"{ckpt.dir}/config.json: num_hidden_layers missing or invalid ({n!r})")
    return n


def _check_pair(bf16: Checkpoint, int8: Checkpoint) -> int:
    n = _num_layers(bf16)
    nq = _num_layers(int8)
    if n != nq:
        raise ModelError(f"num_hidden_layers differs: {n} in {bf16.dir} vs {nq} in {int8.dir}: not the same model")
    for name in bf16.names():
        if any(marker in name for marker in UNSUPPORTED_MARKERS):
            raise ModelError(f"{bf16.dir}: tensor {name!r}: FlashRL's int8 profile covers dense Qwen2/Llama "
                             "layers only (no MoE experts, no q/k norms)")
        if "layernorm" in name and not any(f".{norm}." in name for norm in quantmath.NORMS):
            raise ModelError(f"{bf16.dir}: tensor {name!r}: unsupported norm for FlashRL's int8 profile")
    return n


def _load(ckpt: Checkpoint, names: list[str], role: str) -> dict:
    missing = [n for n in names if n not in ckpt]
    if missing:
        raise ModelError(f"{ckpt.dir}: tensor {missing[0]!r} is missing from the {role} checkpoint"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return dict(ckpt.iter_tensors(names))


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise ModelError(message)


def profile_layer(i: int, bf16: Checkpoint, int8: Checkpoint) -> dict:
    """The profile entries of decoder layer i (FlashRL's keys), reading only that layer's tensors."""
    import torch

    qdtype = getattr(torch, QUANTIZED_LOAD_DTYPE)
    names = _layer_names(i)
    w = _load(bf16, list(names.values()), "bf16")
    qnames = [names[n] for n in quantmath.NORMS] + [names[lin] for lin in quantmath.LINEARS] + \
        [names[lin] + "_scale" for lin in quantmath.LINEARS]
    q = _load(int8, qnames, "int8")
    for key, name in names.items():
        _expect(w[name].shape == q[name].shape,
                f"tensor {name!r}: shape {tuple(w[name].shape)} in {bf16.dir} but {tuple(q[name].shape)} in {int8.dir}")
        if key in quantmath.LINEARS:
            _expect(q[name].dtype == torch.int8,
                    f"{int8.dir}: tensor {name!r} is {q[name].dtype}, expected int8 (W8A8 int-quantized)")
            scale = q[name + "_scale"]
            _expect(scale.numel() == q[name].shape[0],
                    f"{int8.dir}: tensor {name + '_scale'!r} has shape {tuple(scale.shape)}, expected "
                    f"[{q[name].shape[0]}, 1] (channel-wise weight scales)")

    entries: dict[str, dict] = {}
    smooth: dict[str, object] = {}
    for norm in quantmath.NORMS:
        ln_in = q[names[norm]].to(qdtype) / w[names[norm]].float()
        smooth[norm] = ln_in
        entries[names[norm]] = {"input_scale": ln_in, "output_scale": 1.0, "type": qdtype}

    beta = None
    for lin in quantmath.LINEARS:
        name = names[lin]
        wscale = q[name + "_scale"].to(qdtype).view(-1, 1)
        if lin == "self_attn.o_proj":
            entries[name] = {"input_scale": 1.0, "output_scale": 1.0 / wscale.float(), "type": torch.int8}
        elif lin == "mlp.down_proj":
            entries[name] = {"input_scale": 1.0 / beta.view(1, -1), "output_scale": 1.0 / wscale.float(),
                             "type": torch.int8}
        else:
            s_in = smooth[quantmath.SMOOTHED_BY[lin]].view(1, -1)
            out = wscale
            if lin == "mlp.up_proj":
                rows = w[name].shape[0]
                x = (w[name].float() / s_in / wscale).view(rows, -1)
                beta = quantmath.least_square_factor(x, q[name].view(rows, -1)).view(-1, 1)
                out = wscale.float() / beta
            entries[name] = {"input_scale": 1.0 / s_in, "output_scale": 1.0 / out.float(), "type": torch.int8}
    return entries


def compute_profile(bf16_dir: str | Path, int8_dir: str | Path, progress=None) -> dict:
    """FlashRL's int8 profile for a bf16 model and its W8A8 (compressed-tensors) twin, streamed layer by layer.
    Keys are in the order FlashRL writes them (all norms, then q/k/v/o/gate/up, then down)."""
    # The int8 model may be in the compressed-tensors or the vllm-ascend layout: tensor names and values of the
    # int8 weights, scales and norms are the same in both (quant.layout checks the scheme, MoE and layout).
    int8 = open_quantized(int8_dir).checkpoint
    bf16 = Checkpoint(bf16_dir)
    n = _check_pair(bf16, int8)
    layers = []
    for i in range(n):
        layers.append(profile_layer(i, bf16, int8))
        if progress:
            progress(i + 1, n)
    ordered: dict[str, dict] = {}
    groups = (quantmath.NORMS,
              tuple(lin for lin in quantmath.LINEARS if lin != "mlp.down_proj"),
              ("mlp.down_proj",))
    for group in groups:
        for i, entries in enumerate(layers):
            names = _layer_names(i)
            for key in group:
                ordered[names[key]] = entries[names[key]]
    return ordered


def write_profile(bf16_dir: str | Path, int8_dir: str | Path, output: str | Path, progress=None) -> dict:
    """compute_profile, then torch.save to `output` atomically (a temp file renamed into place)."""
    import torch

    profile = compute_profile(bf16_dir, int8_dir, progress=progress)
    atomic_write(output, lambda tmp: torch.save(profile, tmp))
    return profile


def flashrl_profile_command(bf16_dir, int8_dir, output) -> tuple[list[str], dict]:
    """The command line and environment that run FlashRL's own profiler (`flashrl profile --fn int8`)."""
    cmd = [sys.executable, "-c", "import sys; from flash_rl.commands import run; sys.exit(run())",
           "profile", "-m", str(bf16_dir), "-q", str(int8_dir), "-o", str(output), "--fn", "int8"]
    env = {k: v for k, v in os.environ.items() if k != "FLASHRL_CONFIG"}
    env["HF_HUB_OFFLINE"] = "1"
    return cmd, env


def profile_differences(a: dict, b: dict, rtol: float = 1e-5, atol: float = 1e-6) -> list[str]:
    """Where two profiles differ: keys, per-entry fields, value types, dtypes, shapes, and values beyond
    (rtol, atol). Empty when they are equal to float tolerance."""
    import torch

    problems = []
    for key in sorted(set(a) ^ set(b)):
        problems.append(f"{key}: only in {'first' if key in a else 'second'} profile")
    for key in [k for k in a if k in b]:
        ea, eb = a[key], b[key]
        if set(ea) != set(eb):
            problems.append(f"{key}: fields {sorted(ea)} vs {sorted(eb)}")
            continue
        for field in ea:
            va, vb = ea[field], eb[field]
            if isinstance(va, torch.Tensor) != isinstance(vb, torch.Tensor):
                problems.append(f"{key}.{field}: {type(va).__name__} vs {type(vb).__name__}")
            elif isinstance(va, torch.Tensor):
                if va.dtype != vb.dtype or va.shape != vb.shape:
                    problems.append(f"{key}.{field}: {va.dtype}{tuple(va.shape)} vs {vb.dtype}{tuple(vb.shape)}")
                elif not torch.allclose(va, vb, rtol=rtol, atol=atol):
                    worst = ((va - vb).abs() / vb.abs().clamp(min=atol)).max().item()
                    problems.append(f"{key}.{field}: values differ (max relative difference {worst:.3g})")
            elif type(va) is not type(vb) or va != vb:
                problems.append(f"{key}.{field}: {va!r} vs {vb!r}")
    return problems
