"""The bf16 model and its int8 twin are one model: their config.json agree on what shapes the network, and every
shard header's tensor shapes and dtypes agree with that config.

An int8 model of another architecture, or a shard whose shapes contradict its config.json, loads nowhere: vLLM
fails on the nodes at the first weight load or sync. Only headers and config.json are read (no tensor bytes), so
the rule costs what `check` already pays. Names outside the dense decoder's well-known layout (Qwen2/Qwen3, Llama,
Mistral: embed_tokens, the attention and MLP projections, the norms, lm_head) are not judged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from .checkpoint import TensorInfo

# config.json keys the two models must share: what shapes the network (and how vLLM builds it)
PAIR_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size",
             "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings")

FLOAT_DTYPES = {"BF16", "F16", "F32", "F64"}

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def config_mismatches(bf16: Mapping, int8: Mapping) -> list[tuple[str, object, object]]:
    """(key, bf16 value, int8 value) for each shaping key the two config.json give differently. A key absent from
    one of them is not judged (configs of other versions of transformers omit defaults)."""
    return [(key, bf16[key], int8[key]) for key in PAIR_KEYS
            if key in bf16 and key in int8 and bf16[key] != int8[key]]


def _int(config: Mapping, key: str) -> int | None:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def expected_shapes(config: Mapping) -> dict[str, tuple[int, ...]] | None:
    """The shape config.json gives each tensor of one decoder layer ('layer.' prefix) and of the model's top;
    None when config.json lacks what it takes (not a dense decoder config this rule knows)."""
    h, layers, vocab, inter, heads = (_int(config, k) for k in (
        "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "num_attention_heads"))
    if None in (h, layers, vocab, inter, heads):
        return None
    kv = _int(config, "num_key_value_heads") or heads
    head_dim = _int(config, "head_dim") or h // heads
    q, k = heads * head_dim, kv * head_dim
    return {
        "model.embed_tokens.weight": (vocab, h), "lm_head.weight": (vocab, h), "model.norm.weight": (h,),
        "layer.self_attn.q_proj.weight": (q, h), "layer.self_attn.q_proj.bias": (q,),
        "layer.self_attn.k_proj.weight": (k, h), "layer.self_attn.k_proj.bias": (k,),
        "layer.self_attn.v_proj.weight": (k, h), "layer.self_attn.v_proj.bias": (k,),
        "layer.self_attn.o_proj.weight": (h, q),
        "layer.mlp.gate_proj.weight": (inter, h), "layer.mlp.up_proj.weight": (inter, h),
        "layer.mlp.down_proj.weight": (h, inter),
        "layer.input_layernorm.weight": (h,), "layer.post_attention_layernorm.weight": (h,),
    }


def shape_problems(config: Mapping, tensors: Iterable[TensorInfo], int8: bool) -> list[str]:
    """One sentence per tensor whose header contradicts config.json: its shape, a layer index past
    num_hidden_layers, or a dtype that is not a weight's (a float; int8 too in the int8 model)."""
    shapes = expected_shapes(config)
    if shapes is None:
        return []
    layers = config["num_hidden_layers"]
    allowed = FLOAT_DTYPES | ({"I8"} if int8 else set())
    problems = []
    for t in sorted(tensors, key=lambda t: t.name):
        key = t.name
        if m := _LAYER.match(t.name):
            if int(m.group(1)) >= layers:
                problems.append(f"{t.file.name}: tensor {t.name} is of layer {m.group(1)} but config.json has "
                                f"num_hidden_layers {layers}")
                continue
            key = "layer." + m.group(2)
        want = shapes.get(key)
        if want is None:
            continue
        if tuple(t.shape) != want:
            problems.append(f"{t.file.name}: tensor {t.name} has shape {list(t.shape)} but config.json gives "
                            f"{list(want)}")
        elif t.dtype not in allowed:
            problems.append(f"{t.file.name}: tensor {t.name} is {t.dtype}, not a weight's dtype "
                            f"({'/'.join(sorted(allowed))})")
    return problems
