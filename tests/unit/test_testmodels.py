"""The fixture builder: deterministic, loads in transformers (bf16 plainly, int8 through compressed-tensors),
and the int8 twin is what compressed-tensors produces for the smoothed weights."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from rollout8 import cli  # noqa: E402
from rollout8.errors import ModelError  # noqa: E402
from rollout8.quant.checkpoint import Checkpoint  # noqa: E402
from rollout8.quant.testmodels import PRESETS, make_pair, resolve_shape  # noqa: E402

LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def _bytes(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, model_pair):
    again = make_pair(tmp_path / "again", preset="tiny", seed=0)
    assert _bytes(again.bf16) == _bytes(model_pair.bf16)
    assert _bytes(again.int8) == _bytes(model_pair.int8)
    other = make_pair(tmp_path / "other", preset="tiny", seed=1)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(Checkpoint(other.bf16).get(name), Checkpoint(model_pair.bf16).get(name))


def test_layout_matches_public_w8a8_checkpoints(model_pair):
    q = Checkpoint(model_pair.int8)
    cfg = q.config["quantization_config"]
    assert cfg["quant_method"] == "compressed-tensors"
    assert cfg["format"] == "int-quantized"
    assert cfg["ignore"] == ["lm_head"]
    group = cfg["config_groups"]["group_0"]
    assert group["weights"].items() >= {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True,
                                        "dynamic": False}.items()
    assert group["input_activations"].items() >= {"num_bits": 8, "type": "int", "strategy": "token",
                                                  "symmetric": True, "dynamic": True}.items()
    for lin in LINEARS:
        w, s = q.tensors[f"model.layers.0.{lin}.weight"], q.tensors[f"model.layers.0.{lin}.weight_scale"]
        assert w.dtype == "I8" and s.dtype == "BF16" and s.shape == (w.shape[0], 1)
    assert not any(n.endswith(("zero_point", "input_scale")) for n in q.names())
    assert q.tensors["model.embed_tokens.weight"].dtype == "BF16"
    fp = Checkpoint(model_pair.bf16)
    assert set(fp.names()) == {n for n in q.names() if not n.endswith("_scale")}
    # SmoothQuant is folded into the norms: the int8 model's norms differ from the bf16 ones.
    ln = "model.layers.0.input_layernorm.weight"
    assert not torch.allclose(q.get(ln).float(), fp.get(ln).float(), rtol=0.05)


def test_smoothing_preserves_the_function(model_pair):
    """LN_j * W_ij == qLN_j * int8_ij * scale_i up to int8 rounding: the folding moved a factor, changed nothing."""
    fp, q = Checkpoint(model_pair.bf16), Checkpoint(model_pair.int8)
    p = "model.layers.1."
    for norm, lin in [("input_layernorm", "self_attn.k_proj"), ("post_attention_layernorm", "mlp.up_proj")]:
        ref = fp.get(p + norm + ".weight").float() * fp.get(p + lin + ".weight").float()
        scale = q.get(p + lin + ".weight_scale").float()
        got = q.get(p + norm + ".weight").float() * q.get(p + lin + ".weight").float() * scale
        half_lsb = (q.get(p + norm + ".weight").float().abs().view(1, -1) * scale * 0.51
                    + ref.abs() * 0.02)  # bf16 rounding of the smoothed weight, norm and scale
        assert ((got - ref).abs() <= half_lsb).all()


def test_int8_round_trips_through_compressed_tensors_quantize(model_pair):
    """compressed-tensors' own quantize() maps the dequantized weights (int8 * weight_scale) back to the stored int8."""
    from compressed_tensors.quantization.lifecycle.forward import quantize

    from rollout8.quant.testmodels import quantization_scheme

    q = Checkpoint(model_pair.int8)
    args = quantization_scheme().weights
    for lin in LINEARS:
        name = f"model.layers.0.{lin}"
        w, s = q.get(name + ".weight"), q.get(name + ".weight_scale")
        again = quantize(w.float() * s.float(), s.float(), torch.zeros_like(s, dtype=torch.int8), args,
                         dtype=torch.int8)
        assert torch.equal(again, w), name


def test_per_module_compression_equals_model_compressor():
    """compress_linear (module by module, used by the builder) gives exactly what ModelCompressor.compress_model
    gives on a whole Qwen2 model with the same config and minmax scales."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import apply_quantization_config
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rollout8.quant.testmodels import compress_linear, quantization_config

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=300, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    originals = {n: m.weight.detach().clone() for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    biases = {n: m.bias.detach().clone() for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and m.bias is not None}
    qcfg = quantization_config()
    apply_quantization_config(model, qcfg)
    for name, module in model.named_modules():
        if name in originals:
            w = module.weight
            scale, zp = calculate_qparams(w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True),
                                          module.quantization_scheme.weights)
            module.weight_scale.data.copy_(scale)
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.copy_(zp)
    ModelCompressor(quantization_config=qcfg).compress_model(model)
    state = model.state_dict()
    for name, weight in originals.items():
        ours = compress_linear(weight, biases.get(name))
        assert torch.equal(ours["weight"], state[name + ".weight"]), name
        assert torch.equal(ours["weight_scale"], state[name + ".weight_scale"]), name
        assert set(ours) == {k.rsplit(".", 1)[1] for k in state if k.startswith(name + ".")}, name


def test_bf16_model_and_tokenizer_load_in_transformers(model_pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_pair.bf16)
    text = "Natalia sold 48 clips. How many clips?"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    model = AutoModelForCausalLM.from_pretrained(model_pair.bf16, dtype=torch.bfloat16)
    assert model.config.model_type == "qwen2" and model.config.num_key_value_heads == 2
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size) and torch.isfinite(logits).all()
    assert len(tok) <= model.config.vocab_size


def test_int8_model_loads_through_compressed_tensors(model_pair):
    from compressed_tensors.quantization import QuantizationStatus
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_pair.int8)
    q_proj = model.model.layers[0].self_attn.q_proj
    assert q_proj.quantization_status == QuantizationStatus.COMPRESSED
    assert q_proj.quantization_scheme.weights.strategy == "channel"
    stored = Checkpoint(model_pair.int8).get("model.layers.0.self_attn.q_proj.weight")
    assert torch.equal(q_proj.weight, stored)
    assert getattr(model.lm_head, "quantization_scheme", None) is None
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 9, 30]])).logits
    assert torch.isfinite(logits).all()


def test_untied_preset_has_its_own_lm_head(model_pair_factory):
    pair = model_pair_factory("untied")
    for d in (pair.bf16, pair.int8):
        ck = Checkpoint(d)
        assert ck.config["tie_word_embeddings"] is False
        assert ck.tensors["lm_head.weight"].dtype == "BF16"


def test_sharded_output_has_an_index(tmp_path):
    pair = make_pair(tmp_path / "sharded", preset="tiny", shard_bytes=60_000)
    index = json.loads((pair.bf16 / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert Checkpoint(pair.bf16).names() and Checkpoint(pair.int8).names()


def test_presets_and_bad_overrides():
    assert resolve_shape("tiny-engine", {}).head_dim == 64
    assert resolve_shape("mha", {}).num_key_value_heads == resolve_shape("mha", {}).num_attention_heads
    assert 0.45e9 < PRESETS["bench-0.5b"].num_parameters() < 0.55e9
    with pytest.raises(ModelError, match="num_heads"):
        resolve_shape("tiny", {"num_heads": 3})
    with pytest.raises(ModelError, match="unknown preset"):
        resolve_shape("huge", {})
    with pytest.raises(ModelError, match="not divisible"):
        make_pair("/nonexistent/never", preset="tiny", num_attention_heads=3)


def test_cli_builds_and_reports(tmp_path, capsys):
    rc = cli.main(["make-test-model", "-o", str(tmp_path / "m"), "--set", "num_hidden_layers=1", "--seed", "3"])
    assert rc == 0
    assert Checkpoint(tmp_path / "m" / "int8").config["num_hidden_layers"] == 1
    assert "int8:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["make-test-model", "-o", str(tmp_path / "x"), "--set", "num_hidden_layers=two"])
