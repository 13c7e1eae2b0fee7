"""`rollout8 profile` (streaming) and `rollout8 verify-quant` on the fixture pairs, without FlashRL.
Agreement with the real `flashrl profile` is in tests/pipeline/."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")

from rollout8 import cli  # noqa: E402
from rollout8.errors import ModelError  # noqa: E402
from rollout8.quant import quantmath  # noqa: E402
from rollout8.quant.checkpoint import Checkpoint  # noqa: E402
from rollout8.quant.profile import compute_profile, profile_differences, write_profile  # noqa: E402
from rollout8.quant.verify import verify  # noqa: E402


@pytest.fixture(scope="module")
def profile_file(model_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "profile.pt"
    write_profile(model_pair.bf16, model_pair.int8, out)
    return out


def _copy_without(src, dst, drop: str):
    from safetensors.torch import save_file

    dst.mkdir()
    for f in src.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, dst / f.name)
    tensors = {n: t for n, t in Checkpoint(src).iter_tensors() if n != drop}
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_profile_structure(model_pair, profile_file):
    profile = torch.load(profile_file)  # FlashRL loads it exactly like this (weights_only default)
    layers = Checkpoint(model_pair.bf16).config["num_hidden_layers"]
    assert len(profile) == 9 * layers
    ln = profile["model.layers.0.input_layernorm.weight"]
    assert ln["output_scale"] == 1.0 and ln["type"] == torch.float16 and ln["input_scale"].shape == (64,)
    o = profile["model.layers.0.self_attn.o_proj.weight"]
    assert o["input_scale"] == 1.0 and o["type"] == torch.int8 and o["output_scale"].shape == (64, 1)
    k = profile["model.layers.1.self_attn.k_proj.weight"]
    assert k["input_scale"].shape == (1, 64) and k["output_scale"].shape == (32, 1)
    down = profile["model.layers.1.mlp.down_proj.weight"]
    assert down["input_scale"].shape == (1, 128) and down["input_scale"].dtype == torch.float32
    # norms first, then q/k/v/o/gate/up, then down: FlashRL's order
    assert list(profile)[0].endswith("0.input_layernorm.weight")
    assert list(profile)[-1] == f"model.layers.{layers - 1}.mlp.down_proj.weight"
    assert not any(t.requires_grad for e in profile.values() for t in e.values() if isinstance(t, torch.Tensor))


def test_profile_reproduces_the_int8_weights(model_pair, profile_file):
    profile = torch.load(profile_file)
    fp, q = Checkpoint(model_pair.bf16), Checkpoint(model_pair.int8)
    for name, entry in profile.items():
        online = quantmath.apply_entry(fp.get(name), entry)
        if entry["type"] == torch.int8:
            assert quantmath.lsb_stats(online, q.get(name))[0] <= 1, name
        else:
            assert torch.allclose(online.float(), q.get(name).float(), rtol=1e-3), name


def test_profile_differences_detects_changes(profile_file):
    a = torch.load(profile_file)
    b = torch.load(profile_file)
    assert profile_differences(a, b, rtol=0, atol=0) == []
    b["model.layers.0.mlp.up_proj.weight"]["output_scale"] = b["model.layers.0.mlp.up_proj.weight"][
        "output_scale"] * 1.001
    del b["model.layers.1.self_attn.q_proj.weight"]
    problems = profile_differences(a, b)
    assert any("up_proj.weight.output_scale: values differ" in p for p in problems)
    assert any("1.self_attn.q_proj.weight: only in first" in p for p in problems)


def test_missing_tensor_is_named(model_pair, tmp_path):
    broken = _copy_without(model_pair.bf16, tmp_path / "bf16", "model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ModelError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*missing"):
        compute_profile(broken, model_pair.int8)
    broken_q = _copy_without(model_pair.int8, tmp_path / "int8", "model.layers.0.input_layernorm.weight")
    with pytest.raises(ModelError, match=r"model\.layers\.0\.input_layernorm\.weight"):
        compute_profile(model_pair.bf16, broken_q)


def test_mismatched_pairs_are_refused(model_pair, model_pair_factory):
    wider = model_pair_factory("tiny", intermediate_size=96)
    with pytest.raises(ModelError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight.*\(128, 64\).*\(96, 64\)"):
        compute_profile(model_pair.bf16, wider.int8)
    deeper = model_pair_factory("tiny", num_hidden_layers=3)
    with pytest.raises(ModelError, match="num_hidden_layers differs: 2 .* 3"):
        compute_profile(model_pair.bf16, deeper.int8)
    with pytest.raises(ModelError, match="not an int8 model"):
        compute_profile(model_pair.bf16, model_pair.bf16)


def test_profile_cli_progress_and_errors(model_pair, tmp_path, capsys):
    out = tmp_path / "p.pt"
    assert cli.main(["profile", "-m", str(model_pair.bf16), "-q", str(model_pair.int8), "-o", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "layer 1/2" in stdout and "layer 2/2" in stdout and out.is_file()
    assert cli.main(["profile", "-m", str(tmp_path / "nope"), "-q", str(model_pair.int8), "-o", str(out)]) == 2
    assert "nope" in capsys.readouterr().err


def test_verify_passes_on_the_builder_pair(model_pair, profile_file, tmp_path, capsys):
    report = verify(model_pair.bf16, model_pair.int8, profile_file)
    assert report.passed and len(report.rows) == 18
    assert report.worst_lsb() == 1  # FlashRL's float32 rounding vs compressed-tensors' bf16 rounding
    out = tmp_path / "v.json"
    rc = cli.main(["verify-quant", "-m", str(model_pair.bf16), "-q", str(model_pair.int8), "-p", str(profile_file),
                   "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["passed"] and data["summary"]["failed"] == 0 and len(data["rows"]) == 18
    row = next(r for r in data["rows"] if r["name"] == "model.layers.1.mlp.up_proj.weight")
    assert row["layer"] == 1 and row["max_lsb"] == 1 and 0 < row["saturation_share"] < 0.05
    assert "model.layers.1.mlp.down_proj.weight" in capsys.readouterr().out
    # a stricter threshold fails: the 1-LSB differences are real
    assert not verify(model_pair.bf16, model_pair.int8, profile_file, max_lsb=0).passed


def test_verify_fails_on_a_profile_of_another_model(model_pair, model_pair_factory, tmp_path, capsys):
    other = model_pair_factory("tiny", seed=1)
    wrong = tmp_path / "wrong.pt"
    write_profile(other.bf16, other.int8, wrong)
    rc = cli.main(["verify-quant", "-m", str(model_pair.bf16), "-q", str(model_pair.int8), "-p", str(wrong)])
    assert rc == 1
    err = capsys.readouterr().err
    assert "model.layers.0." in err and ("LSB > 1" in err or "relative error" in err)


def test_verify_fails_when_the_profile_misses_a_linear(model_pair, profile_file, tmp_path):
    profile = torch.load(profile_file)
    del profile["model.layers.1.self_attn.v_proj.weight"]
    partial = tmp_path / "partial.pt"
    torch.save(profile, partial)
    report = verify(model_pair.bf16, model_pair.int8, partial)
    assert not report.passed
    assert [(r.name, r.kind) for r in report.failures] == [("model.layers.1.self_attn.v_proj.weight", "missing")]


def test_profile_and_verify_work_on_the_ascend_layout(model_pair, profile_file, tmp_path):
    """The same int8 model converted to vllm-ascend's W8A8_DYNAMIC layout gives the same profile and passes."""
    ascend = tmp_path / "ascend"
    assert cli.main(["convert", "--to", "ascend", str(model_pair.int8), str(ascend)]) == 0
    assert (ascend / "quant_model_description.json").is_file()
    assert profile_differences(compute_profile(model_pair.bf16, ascend), torch.load(profile_file),
                               rtol=0, atol=0) == []
    assert verify(model_pair.bf16, ascend, profile_file).passed
