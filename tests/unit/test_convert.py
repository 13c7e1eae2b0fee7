"""`rollout8 convert --to ascend` on the fixture models: lossless, complete description, vllm-ascend's parameter set.

The expected layout is derived from vllm-ascend at the pinned commit 7e16b4a (`git.vllm-ascend` in versions.lock.yaml):
- vllm_ascend/quantization/w8a8_dynamic.py, AscendW8A8DynamicLinearMethod.get_weight / get_pertensor_param /
  get_perchannel_param / get_pergroup_param: weight int8 [out, in]; weight_scale and weight_offset [out, 1] in
  params_dtype; no per-tensor or per-group parameters.
- vllm_ascend/quantization/quant_config.py, AscendQuantConfig.get_config_filenames / is_layer_skipped_ascend and
  vllm_ascend/quantization/quantizer.py, VLLMAscendQuantizer.get_linear_quant_type: description[prefix + ".weight"]
  for every Linear (fused layers per shard) and VocabParallelEmbedding (embed_tokens, lm_head).
- vLLM's get_quant_config (weight_utils.py): a quantization_config in config.json replaces the description file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rollout8 import cli  # noqa: E402
from rollout8.errors import ModelError  # noqa: E402
from rollout8.quant.checkpoint import Checkpoint  # noqa: E402
from rollout8.quant.convert import MANIFEST_FILE, compare_dequantized, convert_to_ascend  # noqa: E402
from rollout8.quant.layout import (  # noqa: E402
    ASCEND,
    COMPRESSED_TENSORS,
    detect_layout,
    flashrl_overrides,
    open_quantized,
)

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# vLLM's Qwen2ForCausalLM.packed_modules_mapping, which vllm-ascend's lookups walk for fused layers.
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
# The vLLM modules of a Qwen2 layer that are LinearBase (each calls get_quant_method with its prefix).
VLLM_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


@pytest.fixture(scope="module")
def pairs(model_pair_factory):
    return {
        "tiny": model_pair_factory("tiny"),
        "untied": model_pair_factory("untied"),
        "sharded": model_pair_factory("mha", shard_bytes=40_000),
    }


@pytest.fixture(scope="module")
def converted(pairs, tmp_path_factory):
    root = tmp_path_factory.mktemp("ascend")
    return {name: convert_to_ascend(p.int8, root / name, progress=None).out_dir for name, p in pairs.items()}


def _writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for path in [dst, *dst.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dst


@pytest.mark.parametrize("name", ["tiny", "untied", "sharded"])
def test_dequantized_weights_equal_the_source_exactly(pairs, converted, name):
    src, out = open_quantized(pairs[name].int8), open_quantized(converted[name])
    assert src.layout == COMPRESSED_TENSORS and out.layout == ASCEND
    assert set(out.linears) == set(src.linears)
    assert len(out.linears) == 7 * pairs[name].shape.num_hidden_layers
    for prefix in src.linears:
        assert torch.equal(src.dequantized(prefix), out.dequantized(prefix)), prefix
        assert torch.equal(src.int8_weight(prefix), out.int8_weight(prefix)), prefix
    for tensor_name in src.float_names():
        assert torch.equal(src.get(tensor_name), out.get(tensor_name)), tensor_name
    assert compare_dequantized(pairs[name].int8, converted[name]) == len(src.linears)


def test_sharded_source_stays_sharded_with_an_index(pairs, converted):
    src = Checkpoint(pairs["sharded"].int8)
    out = Checkpoint(converted["sharded"])
    assert len({i.file.name for i in src.tensors.values()}) > 1
    assert {i.file.name for i in out.tensors.values()} == {i.file.name for i in src.tensors.values()}
    index = json.loads((converted["sharded"] / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(out.tensors)


@pytest.mark.parametrize("name", ["tiny", "untied"])
def test_description_covers_every_weight_as_vllm_ascend_looks_it_up(pairs, converted, name):
    desc = json.loads((converted[name] / "quant_model_description.json").read_text())
    ckpt = Checkpoint(converted[name])
    assert desc["model_quant_type"] == "W8A8_DYNAMIC"
    # one entry per tensor of the checkpoint
    assert set(ckpt.names()) <= set(desc)
    for i in range(pairs[name].shape.num_hidden_layers):
        p = f"model.layers.{i}."
        for lin in LINEARS:
            for leaf in ("weight", "weight_scale", "weight_offset"):
                assert desc[f"{p}{lin}.{leaf}"] == "W8A8_DYNAMIC"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            assert desc[f"{p}{norm}.weight"] == "FLOAT"
        # what AscendQuantConfig.is_layer_skipped_ascend / get_linear_quant_type do for each vLLM Linear
        for module in VLLM_LINEARS:
            prefix = p + module
            proj = prefix.split(".")[-1]
            shards = [prefix.replace(proj, s) for s in PACKED.get(proj, [proj])]
            kinds = {desc[s + ".weight"] for s in shards}  # KeyError here = KeyError in vllm-ascend
            assert kinds == {"W8A8_DYNAMIC"}, prefix
    # VocabParallelEmbedding lookups (embeddings and head; the head also when tied)
    assert desc["model.embed_tokens.weight"] == "FLOAT"
    assert desc["lm_head.weight"] == "FLOAT"
    assert desc["model.norm.weight"] == "FLOAT"
    # no attention quantization switched on, no RMSNorm anti-outlier patch triggered
    assert "fa_quant_type" not in desc and "kv_quant_type" not in desc
    assert not any("norm.bias" in k for k in desc)


@pytest.mark.parametrize("name", ["tiny", "untied"])
def test_parameters_match_what_w8a8_dynamic_creates(pairs, converted, name):
    """AscendW8A8DynamicLinearMethod (w8a8_dynamic.py @7e16b4a): weight int8 [out, in], weight_scale and
    weight_offset [out, 1] in params_dtype (config torch_dtype), nothing else but the Linear's own bias."""
    ckpt = Checkpoint(converted[name])
    config = json.loads((converted[name] / "config.json").read_text())
    params_dtype = {"bfloat16": "BF16", "float16": "F16"}[config["torch_dtype"]]
    src = Checkpoint(pairs[name].int8)
    for i in range(pairs[name].shape.num_hidden_layers):
        for lin in LINEARS:
            prefix = f"model.layers.{i}.{lin}"
            out_f, in_f = src.tensors[prefix + ".weight"].shape
            expected = {"weight": ("I8", (out_f, in_f)), "weight_scale": (params_dtype, (out_f, 1)),
                        "weight_offset": (params_dtype, (out_f, 1))}
            if prefix + ".bias" in src:
                expected["bias"] = (params_dtype, (out_f,))
            found = {n[len(prefix) + 1:]: (t.dtype, t.shape) for n, t in ckpt.tensors.items()
                     if n.startswith(prefix + ".")}
            assert found == expected, prefix
            assert torch.count_nonzero(ckpt.get(prefix + ".weight_offset")) == 0


def test_config_and_files_as_vllm_ascend_expects(pairs, converted):
    src, out = pairs["tiny"].int8, converted["tiny"]
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and "compression_config" not in config
    src_config = json.loads((src / "config.json").read_text())
    del src_config["quantization_config"]
    assert config == src_config
    # vLLM's get_quant_config: exactly one *.json ending in quant_model_description.json
    assert [p.name for p in out.glob("*.json") if p.name.endswith("quant_model_description.json")] == \
        ["quant_model_description.json"]
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (out / f).read_bytes() == (src / f).read_bytes(), f
    assert detect_layout(out) == ASCEND


def test_flashrl_overrides_select_the_ascend_method(pairs, converted):
    assert flashrl_overrides(converted["tiny"]) == {"quantization": "ascend",
                                                    "module_attribute_to_preserve": ["weight_scale_fp32"]}
    assert flashrl_overrides(pairs["tiny"].int8) == {}


def test_rerun_is_a_noop_and_a_foreign_out_dir_is_refused(pairs, converted, tmp_path):
    result = convert_to_ascend(pairs["tiny"].int8, converted["tiny"], progress=None)
    assert result.skipped
    with pytest.raises(ModelError, match="--force"):
        convert_to_ascend(pairs["untied"].int8, converted["tiny"], progress=None)
    out = tmp_path / "forced"
    out.mkdir()
    (out / "junk").write_text("x")
    convert_to_ascend(pairs["untied"].int8, out, force=True, progress=None)
    assert not (out / "junk").exists() and (out / MANIFEST_FILE).is_file()


def test_ascend_input_and_bf16_input_are_refused(pairs, converted, tmp_path):
    with pytest.raises(ModelError, match="already in the ascend layout"):
        convert_to_ascend(converted["tiny"], tmp_path / "x", progress=None)
    with pytest.raises(ModelError, match="not an int8 model"):
        convert_to_ascend(pairs["tiny"].bf16, tmp_path / "y", progress=None)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def _edit_config(model: Path, edit) -> None:
    path = model / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(strategy="tensor"),
     r"weights.strategy is 'tensor'"),
    (lambda c: c["quantization_config"]["config_groups"]["group_0"]["input_activations"].update(dynamic=False),
     r"input_activations.dynamic is False"),
    (lambda c: c["quantization_config"]["config_groups"]["group_0"].update(input_activations=None),
     r"weight-only"),
    (lambda c: c["quantization_config"].update(format="pack-quantized"), r"format is 'pack-quantized'"),
    (lambda c: c["quantization_config"].update(quant_method="gptq"), r"quant_method is 'gptq'"),
    (lambda c: c.update(num_experts=8), r"mixture-of-experts"),
    (lambda c: c.update(torch_dtype="float32"), r"torch_dtype is 'float32'"),
])
def test_unsupported_inputs_are_refused_by_name(pairs, tmp_path, edit, message):
    model = _writable_copy(pairs["tiny"].int8, tmp_path / "src")
    _edit_config(model, edit)
    with pytest.raises(ModelError, match=message):
        convert_to_ascend(model, tmp_path / "out", progress=None)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # no partial directory left behind


def _rewrite_tensors(model: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    path = model / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_float32_scales_must_be_representable_unless_rounding_is_accepted(pairs, tmp_path):
    model = _writable_copy(pairs["tiny"].int8, tmp_path / "src")
    name = "model.layers.0.self_attn.q_proj.weight_scale"

    def to_f32(tensors):
        for k in [k for k in tensors if k.endswith("weight_scale")]:
            tensors[k] = tensors[k].to(torch.float32)
        tensors[name] = tensors[name] * (1 + 2 ** -12)  # not representable in bf16

    _rewrite_tensors(model, to_f32)
    with pytest.raises(ModelError, match=f"{name.removesuffix('.weight_scale')}.weight_scale is torch.float32"):
        convert_to_ascend(model, tmp_path / "out", progress=None)
    result = convert_to_ascend(model, tmp_path / "out", round_scales=True, progress=None)
    assert result.rounded_scales > 0 and 0 < result.max_scale_rel_change < 2 ** -8
    out = Checkpoint(tmp_path / "out")
    assert out.tensors[name].dtype == "BF16"
    # bf16-exact float32 scales elsewhere convert losslessly
    src = open_quantized(model)
    conv = open_quantized(tmp_path / "out")
    other = "model.layers.1.mlp.down_proj"
    assert torch.equal(src.dequantized(other), conv.dequantized(other))


def test_nonzero_zero_point_is_refused(pairs, tmp_path):
    model = _writable_copy(pairs["tiny"].int8, tmp_path / "src")

    def add_zp(tensors):
        zp = torch.zeros((64, 1), dtype=torch.int8)
        zp[3] = 2
        tensors["model.layers.0.self_attn.o_proj.weight_zero_point"] = zp

    _rewrite_tensors(model, add_zp)
    with pytest.raises(ModelError, match="asymmetric"):
        convert_to_ascend(model, tmp_path / "out", progress=None)


def test_int8_lm_head_is_refused(pairs, tmp_path):
    model = _writable_copy(pairs["untied"].int8, tmp_path / "src")

    def quantize_head(tensors):
        head = tensors.pop("lm_head.weight").float()
        scale = head.abs().amax(dim=1, keepdim=True) / 127
        tensors["lm_head.weight"] = torch.round(head / scale).to(torch.int8)
        tensors["lm_head.weight_scale"] = scale.to(torch.bfloat16)

    _rewrite_tensors(model, quantize_head)
    with pytest.raises(ModelError, match="lm_head is int8; FlashRL's profile never requantizes lm_head"):
        convert_to_ascend(model, tmp_path / "out", progress=None)


def test_mismatch_is_reported_by_the_comparison(pairs, converted, tmp_path):
    broken = _writable_copy(converted["tiny"], tmp_path / "broken")
    name = "model.layers.1.mlp.up_proj.weight_scale"
    _rewrite_tensors(broken, lambda t: t.__setitem__(name, t[name] * 2))
    with pytest.raises(ModelError, match="model.layers.1.mlp.up_proj dequantized weight differs"):
        compare_dequantized(pairs["tiny"].int8, broken)


def test_cli_converts_and_reports_errors_in_one_line(pairs, tmp_path, capsys):
    assert cli.main(["convert", "--to", "ascend", str(pairs["tiny"].int8), str(tmp_path / "out")]) == 0
    assert "verified identical" in capsys.readouterr().out
    assert cli.main(["convert", "--to", "ascend", str(pairs["tiny"].bf16), str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an int8 model" in err[0]


@pytest.mark.parametrize("name", ["tiny", "sharded"])
def test_profile_from_the_converted_model_equals_the_compressed_tensors_one(pairs, converted, name):
    from rollout8.quant.profile import compute_profile

    a = compute_profile(pairs[name].bf16, pairs[name].int8)
    b = compute_profile(pairs[name].bf16, converted[name])
    assert list(a) == list(b) and len(a) == 9 * pairs[name].shape.num_hidden_layers
    for key in a:
        assert set(a[key]) == set(b[key]), key
        for field, va in a[key].items():
            vb = b[key][field]
            if isinstance(va, torch.Tensor):
                assert va.dtype == vb.dtype and torch.equal(va, vb), (key, field)
            else:
                assert va == vb, (key, field)


def test_setup_writes_the_ascend_quantization_method_for_a_converted_model(pairs, converted, tmp_path):
    """`rollout8 setup` on the converted model: FlashRL passes `quantization` to vllm.LLM; without it vLLM
    would build an unquantized model (config.json has no quantization_config)."""
    import yaml

    profile = tmp_path / "profile.pt"
    profile.write_bytes(b"stand-in: setup only checks that the file exists")
    for model, want in ((converted["tiny"], {"quantization": "ascend",
                                            "module_attribute_to_preserve": ["weight_scale_fp32"]}),
                        (pairs["tiny"].int8, {})):
        out = tmp_path / "flashrl.yaml"
        assert cli.main(["setup", "--fn", "int8", "-m", str(model), "-p", str(profile), "-o", str(out)]) == 0
        (entry,) = yaml.safe_load(out.read_text())["configs"]
        assert entry["fn"] == "int8" and entry["model"] == str(model)
        assert {k: entry[k] for k in ("quantization", "module_attribute_to_preserve") if k in entry} == want


def test_verify_quant_passes_on_the_converted_model_as_on_the_source(pairs, converted, tmp_path):
    from rollout8.quant.profile import write_profile
    from rollout8.quant.verify import verify

    profile = tmp_path / "profile.pt"
    write_profile(pairs["tiny"].bf16, converted["tiny"], profile)
    a = verify(pairs["tiny"].bf16, pairs["tiny"].int8, profile)
    b = verify(pairs["tiny"].bf16, converted["tiny"], profile)
    assert a.passed and b.passed
    assert [(r.name, r.max_lsb, r.mismatch_share) for r in a.rows] == \
        [(r.name, r.max_lsb, r.mismatch_share) for r in b.rows]
