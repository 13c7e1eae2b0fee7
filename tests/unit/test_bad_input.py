"""Bad input never costs data: each case is a broken input a tired operator could give a command.

Every case runs the real CLI (`rollout8.cli.main`) in a fresh copy of one workspace (the tiny model pair, its
profile, a valid run spec), after the case has broken what it breaks. Each must: exit non-zero; print one
`rollout8 CMD: error:` line naming the file or field (the case's `names`), and no traceback; change no input;
leave nothing behind (the workspace's files after are the files before, byte for byte).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from workspace import SPEC, make_workspace

from rollout8.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def pristine(model_pair, tmp_path_factory) -> Path:
    """bf16/, int8/, profile.pt, data/ and spec.yaml (valid: `rollout8 check` passes it)."""
    return make_workspace(tmp_path_factory.mktemp("pristine"), model_pair, SPEC)


def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


# ------------------------------------------------------------------ how inputs get broken (each on the copy)
def lying_header(path: Path, length: int = 10**12) -> None:
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", length) + data[8:])


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def edit_header(path: Path, change: Callable[[dict], None]) -> None:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])


def first_tensor(header: dict) -> dict:
    return next(v for k, v in header.items() if k != "__metadata__")


def edit_spec(w: Path, change: Callable[[dict], None]) -> None:
    spec = yaml.safe_load((w / "spec.yaml").read_text())
    change(spec)
    (w / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def profile_named(w: Path, name: str) -> None:
    (w / "profile.pt").rename(w / name)
    edit_spec(w, lambda s: s["model"].update(profile=name))


def shard(w: Path, model: str) -> Path:
    return sorted((w / model).glob("*.safetensors"))[0]


@dataclass
class Case:
    id: str
    argv: list[str]  # {w} is the workspace
    names: str  # what the error line must name ({w} allowed)
    prepare: Callable[[Path], None] | None = None


PROFILE = ["profile", "-m", "{w}/bf16", "-q", "{w}/int8", "--quiet", "-o"]
VERIFY = ["verify-quant", "-m", "{w}/bf16", "-q", "{w}/int8", "-p", "{w}/profile.pt"]
CASES = [
    # a traceback or a huge read instead of one line
    Case("check-spec-not-utf8", ["check", "{w}/spec.yaml"], "{w}/spec.yaml",
         lambda w: (w / "spec.yaml").write_bytes(b"name: \xff\xfe\n")),
    Case("render-spec-not-utf8", ["render", "{w}/spec.yaml", "-o", "{w}/out"], "{w}/spec.yaml",
         lambda w: (w / "spec.yaml").write_bytes(b"\xff\xfe\x00n\x00a")),
    Case("check-spec-bad-yaml", ["check", "{w}/spec.yaml"], "spec.yaml",
         lambda w: (w / "spec.yaml").write_text("name: [unclosed\n")),
    Case("check-spec-is-a-directory", ["check", "{w}/data"], "{w}/data"),
    Case("check-spec-missing", ["check", "{w}/nope.yaml"], "{w}/nope.yaml"),
    Case("profile-truncated-shard", [*PROFILE, "{w}/p2.pt"], "{w}/bf16", lambda w: truncate(shard(w, "bf16"))),
    Case("profile-lying-header-length", [*PROFILE, "{w}/p2.pt"], "{w}/bf16",
         lambda w: lying_header(shard(w, "bf16"))),
    Case("verify-lying-header-length", VERIFY, "{w}/int8", lambda w: lying_header(shard(w, "int8"))),
    Case("convert-lying-header-length", ["convert", "--to", "ascend", "{w}/int8", "{w}/asc"], "{w}/int8",
         lambda w: lying_header(shard(w, "int8"))),
    Case("profile-offsets-past-the-end", [*PROFILE, "{w}/p2.pt"], "{w}/bf16",
         lambda w: edit_header(shard(w, "bf16"), lambda h: first_tensor(h).update(data_offsets=[0, 10**9]))),
    Case("profile-size-disagrees-with-shape", [*PROFILE, "{w}/p2.pt"], "{w}/bf16",
         lambda w: edit_header(shard(w, "bf16"), lambda h: first_tensor(h).update(
             shape=[s * 2 for s in first_tensor(h)["shape"]]))),
    Case("profile-header-not-json", [*PROFILE, "{w}/p2.pt"], "{w}/bf16",
         lambda w: shard(w, "bf16").write_bytes(struct.pack("<Q", 4) + b"\xff\xff\xff\xff")),
    Case("profile-config-not-json", [*PROFILE, "{w}/p2.pt"], "config.json",
         lambda w: (w / "bf16" / "config.json").write_text("{not json")),
    Case("profile-model-missing", ["profile", "-m", "{w}/nope", "-q", "{w}/int8", "-o", "{w}/p2.pt"], "{w}/nope"),
    Case("profile-output-is-a-directory", [*PROFILE, "{w}/data"], "{w}/data"),
    Case("profile-output-parent-is-a-file", [*PROFILE, "{w}/spec.yaml/p.pt"], "{w}/spec.yaml"),
    Case("profile-output-exists-of-another-kind", [*PROFILE, "{w}/notes.txt"], "{w}/notes.txt",
         lambda w: (w / "notes.txt").write_text("my notes\n")),
    Case("verify-json-is-a-directory", [*VERIFY, "--json", "{w}/data"], "{w}/data"),
    Case("setup-output-is-a-directory", ["setup", "-m", "{w}/int8", "-p", "{w}/profile.pt", "-o", "{w}/data"],
         "{w}/data"),
    Case("convert-out-is-a-file", ["convert", "--to", "ascend", "{w}/int8", "{w}/spec.yaml"], "{w}/spec.yaml"),
    # sizes below 1 and counts past what any machine holds (issue 45): refused before a byte is allocated
    Case("make-test-model-negative-size", ["make-test-model", "-o", "{w}/m", "--set", "hidden_size=-64"],
         "hidden_size -64 must be an integer of 1 or more"),
    Case("make-test-model-zero-shard-bytes", ["make-test-model", "-o", "{w}/m", "--set", "shard_bytes=0"],
         "shard_bytes 0 must be an integer of 1 or more"),
    Case("make-test-model-count-past-64-bits",
         ["make-test-model", "-o", "{w}/m", "--set", "num_hidden_layers=99999999999999999999999"],
         "num_hidden_layers 99999999999999999999999 is more than 64 bits hold"),
    Case("make-test-model-pair-past-the-free-space", ["make-test-model", "-o", "{w}/m", "--set",
                                                      "num_hidden_layers=30000000"],
         "cannot write {w}/m: no space left on device (the pair needs about"),
    Case("make-test-model-tensor-past-memory", ["make-test-model", "-o", "{w}/m", "--set", "hidden_size=100000000"],
         "the largest tensor of this shape needs"),
    # an input overwritten
    Case("profile-onto-the-int8-weights", [*PROFILE, "{w}/int8/model.safetensors"], "int8"),
    Case("profile-onto-the-bf16-config", [*PROFILE, "{w}/bf16/config.json"], "bf16"),
    Case("profile-into-the-bf16-directory", [*PROFILE, "{w}/bf16/profile.pt"], "bf16"),
    Case("setup-onto-the-profile", ["setup", "-m", "{w}/int8", "-p", "{w}/profile.pt", "-o", "{w}/profile.pt"],
         "{w}/profile.pt"),
    Case("verify-json-onto-the-profile", [*VERIFY, "--json", "{w}/profile.pt"], "{w}/profile.pt"),
    Case("convert-onto-its-input", ["convert", "--to", "ascend", "{w}/int8", "{w}/int8"], "{w}/int8"),
    Case("convert-into-its-input", ["convert", "--to", "ascend", "{w}/int8", "{w}/int8/ascend"], "{w}/int8"),
    Case("convert-over-the-directory-holding-its-input", ["convert", "--to", "ascend", "{w}/int8", "{w}", "--force"],
         "INT8_DIR"),
    Case("plan-into-the-bf16-directory", ["plan", "{w}/spec.yaml", "-o", "{w}/bf16/plan"], "model.bf16 ({w}/bf16)"),
    Case("plan-into-the-int8-directory-by-dotdot", ["plan", "{w}/spec.yaml", "-o", "{w}/data/../int8/plan"],
         "model.int8 ({w}/int8)"),
    Case("plan-into-the-int8-directory-by-symlink", ["plan", "{w}/spec.yaml", "-o", "{w}/link/plan"],
         "model.int8 ({w}/int8)", lambda w: (w / "link").symlink_to(w / "int8")),
    Case("plan-onto-the-spec", ["plan", "{w}/spec.yaml", "-o", "{w}/spec.yaml"], "SPEC ({w}/spec.yaml)"),
    Case("plan-writes-its-yaml-over-the-profile", ["plan", "{w}/spec.yaml", "-o", "{w}"], "model.profile",
         lambda w: profile_named(w, "flashrl.yaml")),
    Case("render-onto-the-spec", ["render", "{w}/spec.yaml", "-o", "{w}/spec.yaml"], "SPEC ({w}/spec.yaml)"),
    Case("render-into-the-bf16-directory", ["render", "{w}/spec.yaml", "-o", "{w}/bf16/r"], "model.bf16"),
    Case("setup-from-the-spec-into-the-int8-directory", ["setup", "--spec", "{w}/spec.yaml", "-o", "{w}/int8/f.yaml"],
         "model.int8 ({w}/int8)"),
    Case("setup-onto-the-training-data", ["setup", "--spec", "{w}/spec.yaml", "-o", "{w}/data/train.parquet"],
         "data.train"),
    Case("verify-json-into-the-int8-directory", [*VERIFY, "--json", "{w}/int8/v.json"], "{w}/int8"),
    # values out of range
    Case("verify-negative-max-lsb", [*VERIFY, "--max-lsb", "-1"], "--max-lsb"),
    Case("report-unknown-mode", ["report", "{w}/data", "--mode", "fp4", "-o", "{w}/rep"], "--mode"),
    Case("report-negative-skip-first", ["report", "{w}/data", "--skip-first", "-1", "-o", "{w}/rep"],
         "--skip-first"),
    Case("doctor-relative-root", ["doctor", "--accelerator", "cpu", "--root", "relative/dir"], "--root"),
    Case("doctor-negative-npus", ["doctor", "--npus", "-1"], "--npus"),
    Case("doctor-nan-threshold", ["doctor", "--accelerator", "cpu", "--min-disk-gib", "nan"], "--min-disk-gib"),
    Case("logs-negative-steps", ["logs", "{w}/data", "--steps", "-2"], "--steps"),
    Case("report-output-is-its-input", ["report", "{w}/data", "-o", "{w}/data"], "{w}/data"),
    Case("report-output-is-a-file", ["report", "{w}/data", "-o", "{w}/spec.yaml"], "{w}/spec.yaml"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_in_one_line_and_costs_nothing(case: Case, pristine: Path, tmp_path, capsys):
    w = tmp_path / "w"
    shutil.copytree(pristine, w)
    if case.prepare:
        case.prepare(w)
    before = snapshot(w)
    try:
        rc = main([a.replace("{w}", str(w)) for a in case.argv])
    except SystemExit as exc:  # argparse refusing a value: its usage line, then one error line
        rc = exc.code
    out, err = capsys.readouterr()
    name = case.argv[0]
    lines = [line for line in err.splitlines() if line.startswith(f"rollout8 {name}: error:")]
    assert rc != 0, (out, err)
    assert "Traceback" not in out + err, err
    assert len(lines) == 1, err
    assert case.names.replace("{w}", str(w)) in lines[0], lines[0]
    assert snapshot(w) == before, "an input was changed or something was left behind"


# ------------------------------------------------------------------ run spec typing (`rollout8 check`)
def verl_value(key: str, value) -> Callable[[Path], None]:
    return lambda w: edit_spec(w, lambda s: s["verl"].update({key: value}))


SPEC_CASES = [
    ("nnodes-boolean", lambda w: edit_spec(w, lambda s: s["cluster"].update(nnodes=True)), "cluster.nnodes"),
    ("npus-per-node-boolean", lambda w: edit_spec(w, lambda s: s["cluster"].update(npus_per_node=False)),
     "cluster.npus_per_node"),
    ("gpu-memory-utilization-word", verl_value("actor_rollout_ref.rollout.gpu_memory_utilization", "lots"),
     "verl.actor_rollout_ref.rollout.gpu_memory_utilization"),
    ("gpu-memory-utilization-percent", verl_value("actor_rollout_ref.rollout.gpu_memory_utilization", 30),
     "verl.actor_rollout_ref.rollout.gpu_memory_utilization"),
    ("gpu-memory-utilization-mapping", verl_value("actor_rollout_ref.rollout.gpu_memory_utilization", {"a": 1}),
     "verl.actor_rollout_ref.rollout.gpu_memory_utilization"),
    ("total-training-steps-word", verl_value("trainer.total_training_steps", "two"),
     "verl.trainer.total_training_steps"),
    ("save-freq-float", verl_value("trainer.save_freq", 2.5), "verl.trainer.save_freq"),
    ("boolean-key-given-a-number", verl_value("actor_rollout_ref.rollout.enforce_eager", 3),
     "verl.actor_rollout_ref.rollout.enforce_eager"),
    # the one number rule (issue 45): finite, never past 64 bits, in the spec's fields and verl's typed values
    ("hccl-timeout-past-64-bits", lambda w: edit_spec(w, lambda s: s["cluster"]["network"].update(
        hccl_connect_timeout=10**30)), "cluster.network.hccl_connect_timeout"),
    ("nnodes-infinite", lambda w: edit_spec(w, lambda s: s["cluster"].update(nnodes=float("inf"))), "cluster.nnodes"),
    ("total-training-steps-past-64-bits", verl_value("trainer.total_training_steps", 10**20),
     "verl.trainer.total_training_steps"),
    ("duplicate-key", lambda w: (w / "spec.yaml").write_text((w / "spec.yaml").read_text() + "name: u\n"),
     "'name' is given twice"),
    ("spec-of-50-MB", lambda w: (w / "spec.yaml").write_text("# x\n" * 12_500_000), "{w}/spec.yaml"),
]


@pytest.mark.parametrize("prepare,names", [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES])
def test_spec_of_the_wrong_type_is_refused_naming_the_field(prepare, names, pristine: Path, tmp_path, capsys):
    w, text = refused_by_check(prepare, pristine, tmp_path, capsys)
    assert names.replace("{w}", str(w)) in text, text


def refused_by_check(prepare, pristine: Path, tmp_path: Path, capsys) -> tuple[Path, str]:
    """`rollout8 check` on a copy of the workspace broken by prepare: refused, no traceback, nothing changed."""
    w = tmp_path / "w"
    shutil.copytree(pristine, w)
    prepare(w)
    before = snapshot(w)
    rc = main(["check", str(w / "spec.yaml")])
    out, err = capsys.readouterr()
    assert rc != 0, out + err
    assert "Traceback" not in out + err
    assert snapshot(w) == before
    return w, out + err


# ------------------------------------------------------------------ interrupted runs leave nothing behind
def run_until(argv: list[str], marker: str, sig: int, cwd: Path) -> tuple[int, str]:
    """Start `rollout8 ARGV`, send sig once `marker` appears on its stdout (bounded: 120 s), return (rc, output)."""
    import select
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "rollout8", *argv], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    seen, deadline = [], time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if not ready:
                continue
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if marker in line:
                proc.send_signal(sig)
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(seen) + (rest or "")


@pytest.fixture(scope="module")
def deep_pair(model_pair_factory):
    """16 layers of hidden 512: profile and convert take seconds, long enough to be interrupted half-way."""
    return model_pair_factory("deep")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_interrupted_profile_leaves_no_partial_profile(deep_pair, tmp_path, sig):
    import signal

    out = tmp_path / "out"
    out.mkdir()
    rc, text = run_until(["profile", "-m", str(deep_pair.bf16), "-q", str(deep_pair.int8), "-o", str(out / "p.pt")],
                         "layer 1/", getattr(signal, sig), tmp_path)
    assert rc == {"SIGTERM": 143, "SIGINT": 130}[sig], text[-2000:]
    assert "nothing half-written was left" in text and "Traceback" not in text, text[-2000:]
    assert list(out.iterdir()) == [], list(out.iterdir())


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_interrupted_convert_leaves_no_partial_directory_and_a_later_run_cleans_a_killed_ones(deep_pair, tmp_path,
                                                                                              sig):
    import signal
    import subprocess

    out = tmp_path / "asc"
    rc, text = run_until(["convert", "--to", "ascend", str(deep_pair.int8), str(out)], "shard 1/",
                         getattr(signal, sig), tmp_path)
    assert rc == {"SIGTERM": 143, "SIGINT": 130}[sig], text[-2000:]
    assert "Traceback" not in text, text[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [], sorted(p.name for p in tmp_path.iterdir())

    # what a SIGKILLed run leaves (its process gone): the next run removes it
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".asc.{dead.pid}.x1.partial"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"\0" * 1024)
    assert main(["convert", "--to", "ascend", str(deep_pair.int8), str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["asc"]


# ------------------------------------------------------------------ `rollout8 check` judges the artifacts
def drop_scales(w: Path) -> None:
    edit_header(shard(w, "int8"), lambda h: [h.pop(k) for k in [k for k in h if k.endswith(".weight_scale")][:1]])


def edit_profile(w: Path, value: float) -> None:
    import torch

    profile = torch.load(w / "profile.pt", weights_only=True)
    name = next(n for n, e in profile.items() if e["type"] == torch.int8)
    profile[name]["input_scale"] = torch.full_like(profile[name]["input_scale"], value)
    torch.save(profile, w / "profile.pt")


def edit_config(w: Path, model: str, **values) -> None:
    path = w / model / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def transpose_gate_proj(header: dict) -> None:
    entry = header["model.layers.0.mlp.gate_proj.weight"]
    entry["shape"] = entry["shape"][::-1]


def other_profile(pair) -> Callable[[Path], None]:
    from rollout8.quant.profile import write_profile

    return lambda w: write_profile(pair.bf16, pair.int8, w / "profile.pt")


ARTIFACT_CASES = [
    ("bf16-without-config", lambda w: (w / "bf16" / "config.json").unlink(), "model.bf16", "no config.json"),
    ("int8-config-not-json", lambda w: (w / "int8" / "config.json").write_text("{"), "model.int8", "not a JSON"),
    ("int8-shard-truncated", lambda w: truncate(shard(w, "int8"), 0.7), "model.int8", "truncated"),
    ("bf16-shard-offsets-past-the-end", lambda w: edit_header(shard(w, "bf16"), lambda h: first_tensor(h).update(
        data_offsets=[0, 10**9])), "model.bf16", "truncated"),
    ("int8-directory-as-bf16", lambda w: edit_spec(w, lambda s: s["model"].update(bf16="int8")), "model.bf16",
     "is a quantized model"),
    ("bf16-directory-as-int8", lambda w: edit_spec(w, lambda s: s["model"].update(int8="bf16", profile="profile.pt")),
     "model.int8", "holds no int8 weights"),
    ("int8-without-a-weight-scale", drop_scales, "model.int8", "have no weight_scale"),
    # the pair is one model (issue 45 item 3): vLLM would fail on the nodes, at the first load or sync
    ("int8-config-of-another-architecture", lambda w: edit_config(w, "int8", architectures=["LlamaForCausalLM"]),
     "model.int8", "says architectures ['LlamaForCausalLM'] but the bf16 model's"),
    ("int8-config-with-more-layers", lambda w: edit_config(w, "int8", num_hidden_layers=3), "model.int8",
     "says num_hidden_layers 3 but the bf16 model's"),
    ("bf16-shard-shape-contradicts-config", lambda w: edit_header(shard(w, "bf16"), transpose_gate_proj),
     "model.bf16", "tensor model.layers.0.mlp.gate_proj.weight has shape [64, 128] but config.json gives [128, 64]"),
    ("int8-shard-past-the-last-layer", lambda w: edit_config(w, "int8", num_hidden_layers=1), "model.int8",
     "is of layer 1 but config.json has num_hidden_layers 1"),
    ("profile-is-a-directory", lambda w: edit_spec(w, lambda s: s["model"].update(profile="data")), "model.profile",
     "is a directory"),
    ("profile-with-nan-scales", lambda w: edit_profile(w, float("nan")), "model.profile", "NaN, infinite or zero"),
    ("profile-with-zero-scales", lambda w: edit_profile(w, 0.0), "model.profile", "NaN, infinite or zero"),
]


@pytest.mark.parametrize("prepare,field,names", [c[1:] for c in ARTIFACT_CASES], ids=[c[0] for c in ARTIFACT_CASES])
def test_check_refuses_broken_artifacts_naming_the_field(prepare, field, names, pristine: Path, tmp_path, capsys):
    _, text = refused_by_check(prepare, pristine, tmp_path, capsys)
    assert any(field in line and names in line for line in text.splitlines()), text


def test_check_refuses_a_same_shape_profile_of_another_checkpoint(pristine, model_pair_factory, tmp_path, capsys):
    """Rollouts would run on wrong weights, and every shape matches: only a sampled verify-quant sees it."""
    w = tmp_path / "w"
    shutil.copytree(pristine, w)
    other_profile(model_pair_factory("tiny", seed=7))(w)
    rc = main(["check", str(w / "spec.yaml")])
    out = capsys.readouterr().out
    assert rc != 0 and "model.profile" in out and "a sampled verify-quant fails" in out, out


def test_profile_refuses_an_int8_model_as_the_bf16_one(pristine, tmp_path, capsys):
    w = tmp_path / "w"
    shutil.copytree(pristine, w)
    rc = main(["profile", "-m", str(w / "int8"), "-q", str(w / "int8"), "-o", str(w / "p2.pt")])
    err = capsys.readouterr().err
    assert rc != 0 and f"-m {w / 'int8'}" in err and "quantized" in err, err
    assert not (w / "p2.pt").exists()


def test_setup_refuses_a_bf16_model_for_an_int8_config(pristine, tmp_path, capsys):
    w = tmp_path / "w"
    shutil.copytree(pristine, w)
    rc = main(["setup", "--fn", "int8", "-m", str(w / "bf16"), "-p", str(w / "profile.pt"), "-o", str(w / "f.yaml")])
    err = capsys.readouterr().err
    assert rc != 0 and f"-m {w / 'bf16'}" in err and "no int8 weights" in err, err
    assert not (w / "f.yaml").exists()


def test_make_test_model_refuses_to_replace_a_directory_it_did_not_write(tmp_path, capsys):
    mine = tmp_path / "models"
    mine.mkdir()
    (mine / "my-weights.safetensors").write_bytes(b"precious")
    assert main(["make-test-model", "-o", str(mine)]) != 0
    assert "was not written by make-test-model" in capsys.readouterr().err
    assert (mine / "my-weights.safetensors").read_bytes() == b"precious"


def test_render_refuses_to_write_into_a_model_directory(pristine, tmp_path, capsys):
    w = tmp_path / "w"
    shutil.copytree(pristine, w)
    before = snapshot(w)
    assert main(["render", str(w / "spec.yaml"), "-o", str(w / "int8" / "rendered")]) != 0
    assert "lies inside the input directory model.int8" in capsys.readouterr().err
    assert snapshot(w) == before


def test_report_that_fails_half_way_leaves_no_pictures_without_their_page(tmp_path, monkeypatch, capsys):
    """The pictures are drawn, then the page fails (NaN metrics once did this): OUT stays as it was."""
    from rollout8.results import report

    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("".join(f"step:{i} - critic/score/mean:nan - timing_s/step:{1 + i / 10}\n"
                                           for i in range(1, 5)))

    def broken(*args, **kwargs):
        raise ValueError("cannot format nan")

    monkeypatch.setattr(report, "render_html", broken)
    out = tmp_path / "rep"
    assert main(["report", str(run), "--mode", "int8", "-o", str(out)]) != 0
    assert "cannot format nan" in capsys.readouterr().err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# ------------------------------------------------------------------ identity by inode (issue 45, item 2)
def test_an_output_that_is_a_hard_link_of_an_input_is_the_input(pristine, tmp_path, capsys):
    w = tmp_path / "w"
    shutil.copytree(pristine, w)
    os.link(w / "profile.pt", w / "profile-link.pt")
    before = snapshot(w)
    argv = ["setup", "-m", str(w / "int8"), "-p", str(w / "profile.pt"), "-o", str(w / "profile-link.pt")]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "is the input" in err and "by another name" in err, err
    assert snapshot(w) == before


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="a bind mount needs root")
def test_an_output_inside_a_bind_mount_of_a_model_directory_is_inside_the_model(pristine, tmp_path, capsys):
    import subprocess

    w = tmp_path / "w"
    shutil.copytree(pristine, w)
    alias = tmp_path / "alias"
    alias.mkdir()
    if subprocess.run(["mount", "--bind", str(w / "int8"), str(alias)], capture_output=True).returncode != 0:
        pytest.skip("mount --bind is not permitted here (an unprivileged container)")
    try:
        before = snapshot(w)
        assert main(["render", str(w / "spec.yaml"), "-o", str(alias / "rendered")]) != 0
        err = capsys.readouterr().err
        assert "lies inside the input directory model.int8" in err and "by another name" in err, err
        assert snapshot(w) == before
    finally:
        subprocess.run(["umount", str(alias)], check=False)
