"""Patch 0004 (flash-rl-int8-chunked): FlashRL's int8 requantizer in row blocks gives the same int8 values as
FlashRL's own arithmetic and no longer allocates weight-sized float32 temporaries.

Both sides are FlashRL's own flash_rl/flash_quantization.py from the flash-llm-rl wheel at the lock's pin,
unpacked into tmp:
- reference: the wheel's file with 0001 only (upstream's arithmetic untouched; 0001 changes only the device the
  scales are moved to, without which the file cannot run on CPU torch);
- patched: the wheel's file with every flash_rl patch of the bundle applied (`rollout8.node.patches`), as shipped.
Bit identity is torch.equal of the int8 results on Qwen2.5-7B and -32B linear shapes, odd shapes, non-contiguous
inputs, bf16/fp16/fp32 inputs and the scale shapes FlashRL's profile uses; ties and saturation are checked
against literal values as well. The memory bound is measured (RSS high-water mark of one call in a fresh
process, bench/requant_probe.py), not read from the source: it fails on the reference file, which the baseline
test next to it shows.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import upstream_wheels as uw

from rollout8.node import patches

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
DEVICE, CHUNKED = "0001-int8-quantizer-device.patch", "0004-int8-requant-in-row-blocks.patch"
NAME = "model.layers.0.self_attn.q_proj.weight"

# (label, rows, cols): every linear FlashRL's profile requantizes, by shape. The MLP weights are cut to a slice of
# their rows (with their real column count: each row is computed alone, and the slice still spans many blocks and
# ends in a partial one), to keep the test fast; attention weights are whole.
MODEL_SHAPES = [
    ("7B q/o_proj", 3584, 3584), ("7B k/v_proj", 512, 3584), ("7B gate/up_proj rows 0-4095", 4096, 3584),
    ("7B down_proj rows 0-1023", 1024, 18944),
    ("32B q/o_proj", 5120, 5120), ("32B k/v_proj", 1024, 5120), ("32B gate/up_proj rows 0-4095", 4096, 5120),
    ("32B down_proj rows 0-1023", 1024, 27648),
]


@pytest.fixture(scope="module")
def sites(flashrl_pristine, tmp_path_factory) -> dict[str, Path]:
    reference = uw.copy_tree(flashrl_pristine, tmp_path_factory.mktemp("reference") / "site-packages")
    [device] = [p for p in patches.find_patches("flash_rl") if p.path.name == DEVICE]
    assert patches.apply_patch(device, reference).action == "applied now"
    patched = uw.copy_tree(flashrl_pristine, tmp_path_factory.mktemp("patched") / "site-packages")
    applied = patches.apply_patches(patched, "flash_rl")
    assert {r.state for r in applied} == {patches.APPLIED}
    return {"reference": reference, "patched": patched, "applied": [r.patch.path.name for r in applied]}


@pytest.fixture(scope="module")
def quantizers(sites):
    reference, patched = uw.load_quantization(sites["reference"]), uw.load_quantization(sites["patched"])
    assert not hasattr(reference, "int8_in_row_blocks")  # the reference is upstream's arithmetic
    return reference, patched


def test_the_bundle_ships_the_row_block_requantizer(sites, quantizers):
    assert CHUNKED in sites["applied"]
    assert callable(getattr(quantizers[1], "int8_in_row_blocks", None))


class Calls(list):
    def count_is(self, n: int) -> bool:
        """True if the row-block function ran n times; also True where it does not exist (a bundle without
        0004, where these tests compare upstream with itself and test_the_bundle_ships_... fails)."""
        return self.absent or len(self) == n


@pytest.fixture
def spied(quantizers, monkeypatch):
    """The patched module with a call counter around its row-block function (the real one runs): proves the
    patched path, not upstream's expression, computed the result."""
    reference, patched = quantizers
    calls = Calls()
    real = getattr(patched, "int8_in_row_blocks", None)
    calls.absent = real is None
    if real is not None:
        def counting(*args):
            calls.append(args[0].shape)
            return real(*args)

        monkeypatch.setattr(patched, "int8_in_row_blocks", counting)
    return reference, patched, calls


def _profile(output_scale, input_scale) -> dict:
    return {NAME: {"output_scale": output_scale, "input_scale": input_scale, "type": torch.int8}}


def _both(reference, patched, weight, profile):
    theirs = reference.linear_quantize(NAME, weight, profile)
    threads = torch.get_num_threads()
    ours = patched.linear_quantize(NAME, weight, profile)
    assert torch.get_num_threads() == threads  # the patch's one-thread block loop gives the threads back
    assert ours.dtype == theirs.dtype == torch.int8
    assert ours.shape == theirs.shape
    assert torch.equal(ours, theirs), f"{(ours != theirs).sum().item()} of {ours.numel()} int8 values differ"
    return ours


@pytest.mark.parametrize(("label", "rows", "cols"), MODEL_SHAPES, ids=[s[0] for s in MODEL_SHAPES])
def test_bit_identical_on_model_shapes(spied, label, rows, cols):
    reference, patched, calls = spied
    gen = torch.Generator().manual_seed(rows * 100003 + cols)
    weight = torch.empty(rows, cols, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=gen)
    # FlashRL's profile: output_scale = 1 / weight_scale [out, 1], input_scale the SmoothQuant factor [1, in];
    # rows scaled up to 1.5x their absmax saturate, as a weight that grew during training does.
    absmax = weight.abs().amax(dim=1, keepdim=True).float()
    output_scale = 127.0 / absmax * (torch.rand(rows, 1, generator=gen) + 0.5)
    input_scale = torch.rand(1, cols, generator=gen) * 0.5 + 0.75
    q = _both(reference, patched, weight, _profile(output_scale, input_scale))
    assert (q == 127).any() and (q == -128).any() and (q == 0).any()  # saturation both ways, and rounding to 0
    if "o_proj" in label:  # o_proj's entry carries input_scale 1.0 (a Python float)
        _both(reference, patched, weight, _profile(output_scale, 1.0))
    assert calls.count_is(2 if "o_proj" in label else 1) and (calls.absent or calls[0] == (rows, cols))


def _odd_weights():
    gen = torch.Generator().manual_seed(7)

    def w(*shape, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=gen) * 3).to(dtype)

    return [
        ("1x1", w(1, 1)), ("7x13", w(7, 13)), ("33x4097", w(33, 4097)),
        ("1x300007 (a row longer than a block)", w(1, 300007)), ("0x16 (empty)", w(0, 16)),
        ("transposed 4097x33 view", w(33, 4097).t()), ("every 3rd column", w(40, 999)[:, ::3]),
        ("float32 65x257", w(65, 257, dtype=torch.float32)), ("float16 65x257", w(65, 257, dtype=torch.float16)),
    ]


ODD = _odd_weights()


def _scale_sets(rows: int, cols: int):
    gen = torch.Generator().manual_seed(rows * 31 + cols)
    out = torch.rand(rows, 1, generator=gen) * 60 + 1
    inp = torch.rand(1, cols, generator=gen) + 0.5
    return {
        "[out,1] x [1,in]": (out, inp),  # q/k/v, gate/up, down
        "[out,1] x 1.0": (out, 1.0),  # o_proj
        "1.0 x [1,in]": (1.0, inp),  # bf16 * 1.0 stays bf16: the promotion order matters
        "0-dim tensors": (torch.tensor(40.0), torch.tensor(0.75)),  # 0-dim float32 does not promote bf16
        "[in] x [out,1]": (inp.flatten(), out),
    }


@pytest.mark.parametrize("block", [None, 1, 999], ids=["default blocks", "one row per block", "999-element blocks"])
@pytest.mark.parametrize(("label", "weight"), ODD, ids=[o[0] for o in ODD])
def test_bit_identical_on_odd_shapes_and_scales(spied, monkeypatch, block, label, weight):
    reference, patched, calls = spied
    if block is not None:
        monkeypatch.setattr(patched, "INT8_BLOCK_ELEMENTS_CPU", block, raising=False)
    rows, cols = weight.shape
    for scales in _scale_sets(rows, cols).values():
        _both(reference, patched, weight, _profile(*scales))
    assert calls.count_is(len(_scale_sets(rows, cols)))


def test_scales_that_broadcast_the_weight_up_keep_upstream_expression(spied):
    reference, patched, calls = spied
    weight = torch.randn(1, 7).to(torch.bfloat16)
    q = _both(reference, patched, weight, _profile(torch.rand(5, 1) * 100, 1.0))
    assert q.shape == (5, 7) and calls.count_is(1)


@pytest.mark.parametrize("block", [None, 1], ids=["default blocks", "one row per block"])
def test_ties_round_to_even_and_saturate_like_upstream(spied, monkeypatch, block):
    """k / 2 for every integer k in [-301, 301]: exact ties everywhere, 126.5 -> 126, 127.5 -> 127 (128 clamped),
    -127.5 -> -128, -128.5 -> -128; plus +-inf, -0.0 and huge values. Checked against Python's round (half to
    even) too, so the test does not only compare the two functions."""
    reference, patched, calls = spied
    if block is not None:
        monkeypatch.setattr(patched, "INT8_BLOCK_ELEMENTS_CPU", block, raising=False)
    ks = list(range(-301, 302))
    extra = [float("inf"), float("-inf"), -0.0, 3.0e38, -3.0e38]
    weight = torch.tensor([ks + extra] * 3, dtype=torch.float32).to(torch.bfloat16)  # integers <= 301: exact in bf16
    halves = torch.full((3, 1), 0.5)
    q = _both(reference, patched, weight, _profile(halves, torch.ones(1, weight.shape[1])))
    expected = [max(-128, min(127, round(k / 2))) for k in ks] + [127, -128, 0, 127, -128]
    assert q[0].tolist() == expected and q[1].tolist() == expected
    assert {round(2.5), round(-0.5), round(126.5)} == {2, 0, 126}  # Python's round is half-to-even
    assert calls.count_is(1)


# ------------------------------------------------------------------------------------- memory, measured
def _probe():
    spec = importlib.util.spec_from_file_location("requant_probe_under_test", REPO / "bench" / "requant_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GATE_PROJ_7B = (18944, 3584)  # the largest Qwen2.5-7B linear FlashRL requantizes: 136 MB of bf16


@pytest.mark.slow
def test_patched_requantizer_needs_at_most_one_weight_of_extra_memory(sites):
    """Issue 16's bound: at most one weight-sized temporary. What a call adds at its peak (int8 result included,
    which alone is half the weight) stays below the weight's own size."""
    got = _probe().measure(sites["patched"], *GATE_PROJ_7B)
    assert got["file"] == str(sites["patched"] / "flash_rl" / "flash_quantization.py")
    ratio = got["extra_bytes"] / got["weight_bytes"]
    assert 0.5 <= ratio <= 1.0, f"extra peak {got['extra_bytes']} B = {ratio:.2f}x the weight"


@pytest.mark.slow
def test_unpatched_requantizer_allocates_float32_temporaries(sites):
    """The baseline the test above fails on (the same measurement on upstream's arithmetic): float32 temporaries
    of twice the weight's size, three alive at once, about 6x the weight at the peak."""
    got = _probe().measure(sites["reference"], *GATE_PROJ_7B)
    ratio = got["extra_bytes"] / got["weight_bytes"]
    assert ratio >= 4.0, f"extra peak {got['extra_bytes']} B = {ratio:.2f}x the weight"
