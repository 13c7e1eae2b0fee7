"""Test models: a random Qwen2 bf16 checkpoint and its W8A8 (compressed-tensors) twin, built locally.

The int8 twin has the layout of public W8A8 checkpoints such as RedHatAI/Qwen2.5-7B-quantized.w8a8:
`quantization_config` with quant_method compressed-tensors, format int-quantized, weights int8 channel-wise
symmetric static with `weight_scale` [out, 1], activations int8 dynamic per token, `lm_head` ignored.
SmoothQuant (llm-compressor's default Qwen2 mappings: input_layernorm -> q/k/v, post_attention_layernorm ->
gate/up) is folded into the norms, so the int8 norm weights differ from the bf16 ones.

What comes from compressed-tensors itself: the quantization scheme and config (`QuantizationScheme`,
`QuantizationConfig`, `ModelCompressor.update_config`), the weight scales (`calculate_qparams`, as its min-max
observer does) and the int8 packing (`compress_module` with the int-quantized compressor), applied module by
module so a 0.5B model builds without holding a full model object. Hand-rolled, because it needs calibration
data and llm-compressor cannot be installed next to the pinned transformers: the SmoothQuant folding, with
synthetic per-channel activation maxima in place of calibration statistics.

Random weights come from one generator per tensor name, so a (preset, seed, overrides) triple always gives
the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError, WriteError
from ..fileutil import existing_ancestor, sha256_file, sha256_json, staged_dir
from ..models import INT64_MAX

BUILDER_VERSION = "1"  # bump when the output of a given (preset, seed, overrides) changes


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    vocab_size: int = 512
    tie_word_embeddings: bool = True
    mlp_smoothing: bool = False  # also fold a per-channel factor between up_proj rows and down_proj columns
    max_position_embeddings: int = 2048
    shard_bytes: int = 512 * 1024 * 1024

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        """Refuse a shape that cannot be built, before a byte is allocated: a size below 1, one not divisible by
        another, a tensor larger than this machine's free memory (a 30-digit count must not allocate first)."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type not in ("int", int):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelError(f"{field.name} {value} must be an integer of 1 or more")
            if value > INT64_MAX:
                raise ModelError(f"{field.name} {value} is more than 64 bits hold (config.json readers overflow)")
        largest = 4 * max(self.vocab_size * self.hidden_size, self.intermediate_size * self.hidden_size,
                          self.num_attention_heads * self.head_dim * self.hidden_size)  # float32 while drawn
        if largest > available_memory():
            raise ModelError(f"the largest tensor of this shape needs {largest / 2**30:.1f} GiB of memory to draw, "
                             f"more than this machine has free ({available_memory() / 2**30:.1f} GiB): choose a "
                             "smaller shape")
        if self.hidden_size % self.num_attention_heads:
            raise ModelError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelError(f"num_attention_heads {self.num_attention_heads} is not divisible by "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.vocab_size < TOKENIZER_VOCAB:
            raise ModelError(f"vocab_size {self.vocab_size} is smaller than the tokenizer's {TOKENIZER_VOCAB}")

    def bytes_on_disk(self) -> int:
        """About what the pair takes on disk: bf16 (2 bytes a parameter) and int8 (1, plus its float scales)."""
        return 3 * self.num_parameters()

    def num_parameters(self) -> int:
        h, i, v, n = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_hidden_layers
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * h * 2 + 2 * (h * kv) + (h + 2 * kv) + 3 * h * i + 2 * h
        return v * h * (1 if self.tie_word_embeddings else 2) + n * per_layer + h


PRESETS: dict[str, ModelShape] = {
    "tiny": ModelShape(),
    # vLLM's CPU attention needs head_dim 64: the engine tier uses this one.
    "tiny-engine": ModelShape(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512),
    "untied": ModelShape(tie_word_embeddings=False),
    "mha": ModelShape(num_attention_heads=4, num_key_value_heads=4, mlp_smoothing=True),
    # For the memory test: 16 layers of 3.9M parameters (about 190 MB of bf16 + int8); override the depth.
    "deep": ModelShape(hidden_size=512, num_hidden_layers=16, num_attention_heads=8, num_key_value_heads=4,
                       intermediate_size=2048),
    # Qwen2.5-0.5B's shape (494M parameters).
    "bench-0.5b": ModelShape(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                             intermediate_size=4864, vocab_size=151936),
    # Qwen2.5-7B's shape (7.6B parameters, untied lm_head): the NPU acceptance suite's weight-sync and hccl steps.
    "bench-7b": ModelShape(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                           intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_VOCAB = 400
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? The answer is 72.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "Let's think step by step and output the final answer after ####.",
    "The quick brown fox jumps over the lazy dog 0123456789 + - * / = ( ) .",
    "A model is quantized to int8 with scales per channel; the rollout uses the int8 weights.",
]


@dataclass(frozen=True)
class ModelPair:
    bf16: Path
    int8: Path
    shape: ModelShape
    preset: str
    seed: int


# ---------------------------------------------------------------------------------------------------- weights

def _generator(seed: int, name: str):
    import torch

    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))


def _randn(seed: int, name: str, shape: tuple[int, ...], std: float):
    import torch

    return (torch.randn(shape, generator=_generator(seed, name)) * std).to(torch.bfloat16)


def _uniform(seed: int, name: str, shape: tuple[int, ...], low: float, high: float):
    import torch

    return torch.rand(shape, generator=_generator(seed, name)) * (high - low) + low


def _layer_bf16(shape: ModelShape, seed: int, i: int) -> dict:
    import torch

    h, inter, kv = shape.hidden_size, shape.intermediate_size, shape.num_key_value_heads * shape.head_dim
    p = f"model.layers.{i}."
    t = {}
    for name, dims in [("self_attn.q_proj", (h, h)), ("self_attn.k_proj", (kv, h)), ("self_attn.v_proj", (kv, h)),
                       ("self_attn.o_proj", (h, h)), ("mlp.gate_proj", (inter, h)), ("mlp.up_proj", (inter, h)),
                       ("mlp.down_proj", (h, inter))]:
        t[p + name + ".weight"] = _randn(seed, p + name + ".weight", dims, 0.02)
    for name, n in [("self_attn.q_proj", h), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)]:
        t[p + name + ".bias"] = _randn(seed, p + name + ".bias", (n,), 0.02)
    for name in ("input_layernorm", "post_attention_layernorm"):
        t[p + name + ".weight"] = _uniform(seed, p + name + ".weight", (h,), 0.5, 1.5).to(torch.bfloat16)
    return t


def _smooth_factors(seed: int, name: str, weights: list, alpha: float = 0.5):
    """SmoothQuant's per-input-channel factor s = amax(X)^alpha / amax(W)^(1-alpha), with synthetic activation maxima
    (log-normal, a few outlier channels) standing in for calibration statistics."""
    import torch

    n = weights[0].shape[1]
    act_max = torch.exp(torch.randn((n,), generator=_generator(seed, name + ":act")) * 0.8)
    w_max = torch.stack([w.float().abs().amax(dim=0) for w in weights]).amax(dim=0)
    s = act_max.pow(alpha) / w_max.clamp(min=1e-8).pow(1 - alpha)
    return torch.where(w_max > 0, s, act_max)


def quantization_scheme():
    """W8 channel-wise symmetric static, A8 per-token symmetric dynamic: the RedHatAI w8a8 scheme.
    A fresh object each call: compress_module records the format on the scheme it is given."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    return QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(num_bits=8, type="int", strategy="channel", symmetric=True, dynamic=False,
                                 observer="minmax"),
        input_activations=QuantizationArgs(num_bits=8, type="int", strategy="token", symmetric=True,
                                           dynamic=True, observer=None),
    )


def quantization_config():
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    return QuantizationConfig(config_groups={"group_0": quantization_scheme()}, format="int-quantized",
                              ignore=["lm_head"], quantization_status=QuantizationStatus.COMPRESSED)


def compress_linear(weight, bias=None) -> dict:
    """Quantize one Linear's (already smoothed) bf16 weight with compressed-tensors: minmax channel scale via
    `calculate_qparams`, int8 packing via the int-quantized compressor. Returns {weight, weight_scale[, bias]}."""
    import torch
    from compressed_tensors.compressors.base import compress_module
    from compressed_tensors.quantization.lifecycle.initialize import initialize_module_for_quantization
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = quantization_scheme()
    out_f, in_f = weight.shape
    with torch.device("meta"):
        module = torch.nn.Linear(in_f, out_f, bias=bias is not None, dtype=weight.dtype)
    module.weight = torch.nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        module.bias = torch.nn.Parameter(bias, requires_grad=False)
    initialize_module_for_quantization(module, scheme)
    scale, zero_point = calculate_qparams(weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True),
                                          scheme.weights)
    module.weight_scale.data.copy_(scale)
    module.weight_zero_point.data.copy_(zero_point)
    compress_module(module, "int-quantized")
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _layer_int8(shape: ModelShape, seed: int, i: int, bf16: dict) -> dict:
    import torch

    p = f"model.layers.{i}."
    out = {}
    weights = {k: v for k, v in bf16.items()}
    groups = [("input_layernorm", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
              ("post_attention_layernorm", ["mlp.gate_proj", "mlp.up_proj"])]
    for norm, linears in groups:
        s = _smooth_factors(seed, p + norm, [bf16[p + lin + ".weight"] for lin in linears])
        out[p + norm + ".weight"] = (bf16[p + norm + ".weight"].float() / s).to(torch.bfloat16)
        for lin in linears:
            weights[p + lin + ".weight"] = (bf16[p + lin + ".weight"].float() * s.view(1, -1)).to(torch.bfloat16)
    if shape.mlp_smoothing:
        t = torch.exp(torch.randn((shape.intermediate_size,), generator=_generator(seed, p + "mlp:t")) * 0.3)
        up, down = p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"
        weights[up] = (weights[up].float() / t.view(-1, 1)).to(torch.bfloat16)
        weights[down] = (weights[down].float() * t.view(1, -1)).to(torch.bfloat16)
    for lin in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        packed = compress_linear(weights[p + lin + ".weight"], bf16.get(p + lin + ".bias"))
        out.update({p + lin + "." + k: v for k, v in packed.items()})
    return out


# ---------------------------------------------------------------------------------------------------- files

class _ShardWriter:
    """Accumulates tensors and writes safetensors shards of about `shard_bytes`, then the index if >1 shard."""

    def __init__(self, directory: Path, shard_bytes: int):
        self.dir, self.limit = directory, shard_bytes
        self.pending: dict = {}
        self.pending_bytes = 0
        self.files: list[tuple[Path, list[str]]] = []

    def add(self, tensors: dict) -> None:
        for name, tensor in tensors.items():
            self.pending[name] = tensor.contiguous()
            self.pending_bytes += tensor.numel() * tensor.element_size()
        if self.pending_bytes >= self.limit:
            self.flush()

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        path = self.dir / f"shard-{len(self.files):05d}.tmp"
        save_file(self.pending, str(path), metadata={"format": "pt"})
        self.files.append((path, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        self.flush()
        if len(self.files) == 1:
            self.files[0][0].rename(self.dir / "model.safetensors")
            return
        n = len(self.files)
        weight_map, total = {}, 0
        for k, (path, names) in enumerate(self.files):
            final = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
            total += path.stat().st_size
            path.rename(self.dir / final)
            weight_map.update({name: final for name in names})
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _config(shape: ModelShape, eos_id: int, bos_id: int) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "max_window_layers": shape.num_hidden_layers,
        "model_type": "qwen2",
        "num_attention_heads": shape.num_attention_heads,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_key_value_heads": shape.num_key_value_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": shape.max_position_embeddings,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": shape.vocab_size,
    }


def write_tokenizer(directory: Path) -> dict[str, int]:
    """A small byte-level BPE tokenizer trained on a fixed corpus (deterministic), with ChatML special tokens.
    Loads with transformers' AutoTokenizer (PreTrainedTokenizerFast) and so with vLLM. Returns special token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    tok.save(str(directory / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return ids


def _write_common(directory: Path, shape: ModelShape, quantized: bool) -> None:
    ids = write_tokenizer(directory)
    eos, pad = ids["<|im_end|>"], ids["<|endoftext|>"]
    (directory / "config.json").write_text(json.dumps(_config(shape, eos, pad), indent=2, sort_keys=True) + "\n")
    gen = {"bos_token_id": pad, "eos_token_id": [eos, pad], "pad_token_id": pad, "do_sample": False}
    (directory / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if quantized:
        from compressed_tensors.compressors import ModelCompressor

        ModelCompressor(quantization_config=quantization_config()).update_config(str(directory))


def build(bf16_dir: Path, int8_dir: Path, shape: ModelShape, seed: int, progress=None) -> None:
    """Write both checkpoints, layer by layer (only one layer's tensors and one shard in flight)."""
    import torch

    shape.validate()
    for d in (bf16_dir, int8_dir):
        d.mkdir(parents=True, exist_ok=True)
    _write_common(bf16_dir, shape, quantized=False)
    _write_common(int8_dir, shape, quantized=True)
    fp, q = _ShardWriter(bf16_dir, shape.shard_bytes), _ShardWriter(int8_dir, shape.shard_bytes)
    shared = {"model.embed_tokens.weight": _randn(seed, "model.embed_tokens.weight",
                                                  (shape.vocab_size, shape.hidden_size), 0.02)}
    fp.add(shared)
    q.add(shared)
    for i in range(shape.num_hidden_layers):
        layer = _layer_bf16(shape, seed, i)
        fp.add(layer)
        q.add(_layer_int8(shape, seed, i, layer))
        if progress:
            progress(f"layer {i + 1}/{shape.num_hidden_layers}")
    tail = {"model.norm.weight": _uniform(seed, "model.norm.weight", (shape.hidden_size,), 0.5, 1.5)
            .to(torch.bfloat16)}
    if not shape.tie_word_embeddings:
        tail["lm_head.weight"] = _randn(seed, "lm_head.weight", (shape.vocab_size, shape.hidden_size), 0.02)
    fp.add(tail)
    q.add(tail)
    fp.close()
    q.close()


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def available_memory() -> int:
    """This machine's available memory in bytes (MemAvailable), or 8 GiB where /proc/meminfo is not."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 8 * 2**30


def resolve_shape(preset: str, overrides: dict) -> ModelShape:
    if preset not in PRESETS:
        raise ModelError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ModelShape)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise ModelError(f"unknown shape field(s) {', '.join(bad)}; valid: {', '.join(sorted(fields))}")
    shape = dataclasses.replace(PRESETS[preset], **overrides)
    shape.validate()
    return shape


def make_pair(out_dir: str | Path, preset: str = "tiny", seed: int = 0, progress=None, **overrides) -> ModelPair:
    """Build `<out_dir>/bf16` and `<out_dir>/int8`. Idempotent: an existing complete pair built from the same
    inputs by the same builder version is reused. Written to a temporary sibling first, then renamed."""
    shape = resolve_shape(preset, overrides)
    out = Path(out_dir)
    stamp = {"builder": BUILDER_VERSION, "preset": preset, "seed": seed, "shape": dataclasses.asdict(shape)}
    pair = ModelPair(bf16=out / "bf16", int8=out / "int8", shape=shape, preset=preset, seed=seed)
    stamp_file = out / "testmodel.json"
    if stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp and pair.bf16.is_dir() \
            and pair.int8.is_dir():
        return pair
    existing = existing_ancestor(out)
    free = shutil.disk_usage(existing).free
    if shape.bytes_on_disk() > free:
        raise WriteError(out, f"no space left on device (the pair needs about {_size(shape.bytes_on_disk())}, bf16 and "
                         f"int8; {existing} has {_size(free)} free)", "free space, choose a smaller shape or name "
                         "another directory")
    with staged_dir(out) as tmp:
        build(tmp / "bf16", tmp / "int8", shape, seed, progress=progress)
        (tmp / "testmodel.json").write_text(json.dumps(stamp, indent=2) + "\n")
    return pair


def _digest(data) -> str:
    return sha256_json(data)[:12]


def cache_key(preset: str, seed: int, overrides: dict) -> str:
    """`<preset>-s<seed>-<inputs digest>-<builder source digest>`: a changed builder gives a new key."""
    source = sha256_file(__file__)
    return f"{preset}-s{seed}-{_digest(overrides)}-{source[:12]}"


def cached_pair(cache_dir: str | Path, preset: str = "tiny", seed: int = 0, **overrides) -> ModelPair:
    """make_pair under `cache_dir/<cache_key>`, reused across sessions while the builder is unchanged; pairs of
    the same inputs built by an older builder are removed."""
    key = cache_key(preset, seed, overrides)
    root = Path(cache_dir)
    stem = key.rsplit("-", 1)[0] + "-"
    if root.is_dir():
        for old in root.glob(stem + "*"):
            if old.name != key and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    return make_pair(root / key, preset=preset, seed=seed, **overrides)
