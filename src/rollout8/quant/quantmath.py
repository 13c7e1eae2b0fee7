"""The int8 arithmetic FlashRL applies at every weight sync, in one place.

A FlashRL int8 profile maps HF parameter names to `{"input_scale", "output_scale", "type"}`; at each sync
FlashRL turns the trainer's bf16 weight W into

    type == int8:  clamp(round(W * output_scale * input_scale), -128, 127) as int8     (the linears)
    otherwise:     (W * output_scale * input_scale) as `type`                          (the layer norms)

`profile`, `verify-quant`, the cluster probe job and the engine tests all use these functions, so the
arithmetic (including its operation order, which decides float rounding) is written once. Device-agnostic:
everything happens on the tensor's own device (FlashRL's own version calls torch.cuda.current_device()).
"""

from __future__ import annotations

INT8_MIN, INT8_MAX = -128, 127

# The dense layer names FlashRL's int8 profile covers, per decoder layer (stack-facts: no MoE experts).
NORMS = ("input_layernorm", "post_attention_layernorm")
SMOOTHED_BY = {  # linear -> the norm whose SmoothQuant factor is folded into its input columns
    "self_attn.q_proj": "input_layernorm",
    "self_attn.k_proj": "input_layernorm",
    "self_attn.v_proj": "input_layernorm",
    "mlp.gate_proj": "post_attention_layernorm",
    "mlp.up_proj": "post_attention_layernorm",
}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _to(value, device):
    import torch

    return value.to(device) if isinstance(value, torch.Tensor) else value


def scaled(weight, entry: dict):
    """W * output_scale * input_scale, in FlashRL's order, before rounding/casting."""
    return weight * _to(entry["output_scale"], weight.device) * _to(entry["input_scale"], weight.device)


def apply_entry(weight, entry: dict):
    """What FlashRL's sync makes of one weight: int8 for the linears, `type` for the norms."""
    import torch

    value = scaled(weight, entry)
    if entry["type"] == torch.int8:
        return torch.round(value).clamp(min=INT8_MIN, max=INT8_MAX).to(torch.int8)
    return value.to(entry["type"])


def apply_profile(weights, profile: dict):
    """Yield (name, tensor) like FlashRL's `flash_quantize`: profiled names transformed, others passed through."""
    for name, tensor in weights:
        yield name, apply_entry(tensor, profile[name]) if name in profile else tensor


def least_square_factor(x, y):
    """Per-row beta minimising |beta * x - y|^2 over the last dim: sum(x*y) / sum(x*x), shape [rows, 1]."""
    y = y.float()
    return (y * x).sum(dim=-1, keepdim=True) / (x ** 2).sum(dim=-1, keepdim=True)


def lsb_stats(online, reference) -> tuple[int, float, float]:
    """Compare two int8 tensors: (max |difference| in LSB, share of entries that differ, share of saturated
    entries in `online`, i.e. at -128 or 127)."""
    import torch

    diff = (online.to(torch.int16) - reference.to(torch.int16)).abs()
    n = max(diff.numel(), 1)
    saturated = ((online == INT8_MIN) | (online == INT8_MAX)).sum().item()
    return int(diff.max().item()) if diff.numel() else 0, diff.ne(0).sum().item() / n, saturated / n
