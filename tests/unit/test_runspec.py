"""The run spec model: shipped specs load, bad fields fail at load with their dotted path, paths resolve."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rollout8.errors import SpecError
from rollout8.runspec.runspec import load_spec, parse_spec

REPO = Path(__file__).resolve().parents[2]
SPECS = sorted((REPO / "configs" / "runs").glob("*.yaml"))

MINIMAL = {
    "name": "r",
    "model": {"bf16": "m/bf16", "int8": "m/int8"},
    "rollout": {"quantization": "int8"},
    "cluster": {"nnodes": 2, "npus_per_node": 8},
    "data": {"train": "d/train.parquet", "val": "d/val.parquet"},
}


def spec_file(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_shipped_specs_load(path):
    spec = load_spec(path)
    assert spec.name == path.stem and spec.source == path.resolve()


def test_typos_fail_with_one_line_per_field(tmp_path):
    raw = yaml.safe_load(yaml.safe_dump(MINIMAL))
    raw["cluster"]["npus_per_nod"] = 8
    raw["rollout"] = {"quantisation": "int8"}
    with pytest.raises(SpecError) as err:
        load_spec(spec_file(tmp_path, raw))
    lines = str(err.value).splitlines()
    assert any("cluster.npus_per_nod: unknown field" in line for line in lines)
    assert any("rollout.quantisation: unknown field" in line for line in lines)
    assert any("rollout.quantization: required field is missing" in line for line in lines)
    assert all(line.startswith(str(tmp_path / "run.yaml")) for line in lines)


@pytest.mark.parametrize("patch, field", [
    ({"rollout": {"quantization": "int4"}}, "rollout.quantization"),
    ({"cluster": {"nnodes": 0, "npus_per_node": 8}}, "cluster.nnodes"),
    ({"cluster": {"nnodes": 1, "npus_per_node": 8, "accelerator": "gpu"}}, "cluster.accelerator"),
    ({"deploy": {"root": "runs/r"}}, "deploy.root"),
    ({"name": "Bad Name"}, "name"),
    ({"env": {"1X": "a"}}, "env"),
    ({"verl": {"trainer nnodes": 1}}, "verl"),
    ({"cluster": {"nnodes": 1, "npus_per_node": 8, "network": {"nic": "eth0; rm"}}}, "cluster.network.nic"),
    ({"cluster": {"nnodes": 1, "npus_per_node": 8, "network": {"hccl_host_socket_port_range": "9-1"}}},
     "cluster.network.hccl_host_socket_port_range"),
])
def test_bad_values_name_the_field(tmp_path, patch, field):
    with pytest.raises(SpecError, match=rf": {field}: "):
        parse_spec({**MINIMAL, **patch}, tmp_path)


def test_a_malformed_port_range_is_named_in_words_not_as_a_regex(tmp_path):
    bad = {"cluster": {"nnodes": 1, "npus_per_node": 8, "network": {"hccl_npu_socket_port_range": "61000:61050"}}}
    with pytest.raises(SpecError) as err:
        parse_spec({**MINIMAL, **bad}, tmp_path)
    assert str(err.value).endswith("cluster.network.hccl_npu_socket_port_range: '61000:61050' is not a port range: "
                                   "LOW-HIGH, e.g. 60000-60050"), str(err.value)
    assert "\\d" not in str(err.value)


def test_int8_needs_the_int8_model(tmp_path):
    raw = {**MINIMAL, "model": {"bf16": "m/bf16"}}
    with pytest.raises(SpecError, match="model.int8 is required"):
        parse_spec(raw, tmp_path)
    parse_spec({**raw, "rollout": {"quantization": "bf16"}}, tmp_path)  # the baseline does not


def test_hybrid_section_only_for_hybrid(tmp_path):
    with pytest.raises(SpecError, match="rollout.hybrid is only valid"):
        parse_spec({**MINIMAL, "rollout": {"quantization": "int8", "hybrid": {"int8": 1, "bf16": 1}}}, tmp_path)
    spec = parse_spec({**MINIMAL, "rollout": {"quantization": "hybrid"}}, tmp_path)
    assert (spec.rollout.mix.int8, spec.rollout.mix.bf16) == (1, 1)


def test_relative_paths_resolve_against_the_spec_file(tmp_path):
    spec = load_spec(spec_file(tmp_path, MINIMAL))
    assert spec.model.bf16 == tmp_path / "m/bf16"
    assert spec.model.profile_path == tmp_path / "m/int8/profile.pt"
    assert spec.data.train == tmp_path / "d/train.parquet"


def test_node_paths(tmp_path):
    spec = parse_spec(MINIMAL, tmp_path)
    root = "/var/lib/rollout8/runs/r"
    assert spec.deploy_root == root
    assert [spec.node_path(w) for w in ("bf16", "int8", "profile", "flashrl", "train", "val")] == [
        f"{root}/models/bf16", f"{root}/models/int8", f"{root}/profile.pt", f"{root}/flashrl.yaml",
        f"{root}/data/train.parquet", f"{root}/data/val.parquet"]
    shared = parse_spec({**MINIMAL, "model": {"bf16": "/nfs/bf16", "int8": "/nfs/int8"},
                         "deploy": {"shared_storage": True, "root": "/nfs/runs/r"}}, tmp_path)
    assert shared.node_path("int8") == "/nfs/int8" and shared.node_path("profile") == "/nfs/int8/profile.pt"
    assert shared.node_path("flashrl") == "/nfs/runs/r/flashrl.yaml"
    assert shared.artifacts() == ["bf16", "int8", "profile", "train", "val"]
    bf16 = parse_spec({**MINIMAL, "rollout": {"quantization": "bf16"}}, tmp_path)
    assert bf16.artifacts() == ["bf16", "train", "val"] and not bf16.flashrl


def test_env_values_become_strings(tmp_path):
    spec = parse_spec({**MINIMAL, "env": {"A": 1, "B": True, "C": "x"}}, tmp_path)
    assert spec.env == {"A": "1", "B": "1", "C": "x"}


def test_not_a_mapping(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="a run spec is a YAML mapping"):
        load_spec(path)
    with pytest.raises(SpecError, match="run spec not found"):
        load_spec(tmp_path / "missing.yaml")


def test_a_key_given_twice_is_refused_naming_file_and_both_lines(tmp_path):
    """Inside a section too (plain YAML would keep the last nnodes, silently)."""
    path = tmp_path / "run.yaml"
    text = yaml.safe_dump(MINIMAL, sort_keys=False)
    lines = text.splitlines(keepends=True)
    first = lines.index("  nnodes: 2\n") + 1
    lines.insert(first, "  nnodes: 4\n")
    path.write_text("".join(lines))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value) == f"{path}:{first + 1}: key 'nnodes' is given twice (first at line {first}): keep one"


@pytest.mark.parametrize("section, key, shown", [
    ("env", "1", "key 1 is not a string (int): quote it ('1')"),
    ("env", "null", "key None is not a string (NoneType): quote it ('null')"),
    ("verl", "? [trainer.nnodes, trainer.device]\n ", "key ['trainer.nnodes', 'trainer.device'] is not a string"),
])
def test_a_key_that_is_not_a_string_is_refused_naming_the_line(tmp_path, section, key, shown):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(MINIMAL, sort_keys=False) + f"{section}:\n {key}: x\n")
    line = len(yaml.safe_dump(MINIMAL).splitlines()) + 2
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value).startswith(f"{path}:{line}: {shown}"), str(err.value)


def test_configs_readme_matches_the_model():
    """configs/README.md carries `rollout8 check --explain`'s field reference: a new field must be documented."""
    from rollout8.runspec.runspec import explain

    readme = (REPO / "configs" / "README.md").read_text()
    missing = [line for line in explain().splitlines() if line not in readme]
    assert missing == [], "regenerate the field reference in configs/README.md from `rollout8 check --explain`"
