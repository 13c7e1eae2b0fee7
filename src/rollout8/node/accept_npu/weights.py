"""The reload step's arithmetic: the int8 weights the engine should hold after a FlashRL weight update.

The weight comparison handles what vllm-ascend's W8A8_DYNAMIC post-load step does to the engine's int8
weights: q/k/v and gate/up fused (vLLM), transposed to [in, out] and cast to the NPU's NZ format (29). The node
side reads each weight back in the ND format (npu_format_cast to 2, then to the host); here the orientation is
detected from the non-square fused weights and applied to all (a square o_proj cannot tell by itself).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_LSB = 1  # FlashRL's fitted up/down factor moves a few entries by one LSB from the checkpoint (stack-facts)

# vLLM's fused parameters of a Qwen2/Llama decoder layer and the HF weights they are made of, in order.
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}
NZ_FORMAT, ND_FORMAT = 29, 2


def expected_fused(hf: dict, num_layers: int) -> dict:
    """HF-named int8 weights [out, in] (e.g. quantmath.apply_profile's output) -> vLLM's fused names, still
    [out, in]: q/k/v and gate/up concatenated along the output dimension in that order."""
    import torch

    out = {}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        for fused, parts in FUSED.items():
            names = [p + part + ".weight" for part in parts]
            if all(n in hf for n in names):
                out[p + fused + ".weight"] = torch.cat([hf[n] for n in names], dim=0)
    return out


def detect_orientation(engine: dict, expected: dict) -> bool:
    """True if the engine keeps its int8 weights transposed ([in, out]), False if [out, in]. Decided on the
    non-square weights; raises ValueError if they disagree or fit neither (a layout this code does not know)."""
    votes = set()
    for name, want in expected.items():
        got = engine.get(name)
        if got is None or want.shape[0] == want.shape[1]:
            continue
        if tuple(got.shape) == tuple(want.shape):
            votes.add(False)
        elif tuple(got.shape) == tuple(want.shape[::-1]):
            votes.add(True)
        else:
            raise ValueError(f"{name}: engine shape {tuple(got.shape)} is neither {tuple(want.shape)} nor its "
                             f"transpose")
    if len(votes) != 1:
        raise ValueError("cannot tell the engine's weight orientation" if not votes else
                         "the engine keeps some int8 weights transposed and others not")
    return votes.pop()


@dataclass
class WeightComparison:
    transposed: bool | None
    rows: dict  # name -> (max LSB, share differing, share saturated)
    missing: list[str]
    problem: str = ""

    @property
    def worst_lsb(self) -> int:
        return max((r[0] for r in self.rows.values()), default=0)

    def ok(self, max_lsb: int = MAX_LSB) -> bool:
        return not self.problem and not self.missing and bool(self.rows) and self.worst_lsb <= max_lsb


def compare_engine_int8(engine: dict, expected: dict) -> WeightComparison:
    """Engine int8 weights (vLLM names, as read back in ND format) vs the expected fused [out, in] weights."""
    from ...quant.quantmath import lsb_stats

    missing = sorted(n for n in expected if n not in engine)
    try:
        transposed = detect_orientation(engine, expected)
    except ValueError as exc:
        return WeightComparison(None, {}, missing, str(exc))
    rows = {}
    for name, want in expected.items():
        got = engine.get(name)
        if got is None:
            continue
        got = got.t() if transposed else got
        if tuple(got.shape) != tuple(want.shape):
            return WeightComparison(transposed, rows, missing, f"{name}: shape {tuple(got.shape)} vs "
                                                               f"{tuple(want.shape)}")
        rows[name] = lsb_stats(got, want)
    return WeightComparison(transposed, rows, missing)
