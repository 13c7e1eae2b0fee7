"""rollout8.yamlio, the one strict reader of the YAML (and JSON) the product reads: a key given twice, a key that is
not a string, a file that is not UTF-8 and a syntax error are each refused in one line naming the file and the line,
in every reader (the lock and the run spec: test_lock.py, test_runspec.py; FlashRL configs and plans: here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rollout8.errors import LockError, ModelError, SpecError
from rollout8.yamlio import load_json, load_yaml, read_yaml


@pytest.mark.parametrize("text, message", [
    ("a: 1\nb:\n  x: 1\n  y: 2\n  x: 3\n", "f.yaml:5: key 'x' is given twice (first at line 3): keep one"),
    ("- {a: 1, a: 2}\n", "f.yaml:1: key 'a' is given twice (first at line 1): keep one"),
    ("a: 1\n2: b\n", "f.yaml:2: key 2 is not a string (int): quote it ('2')"),
    ("yes: 1\n", "f.yaml:1: key True is not a string (bool): quote it ('yes')"),
    ("a:\n  ? [x, y]\n  : 1\n", "f.yaml:2: key ['x', 'y'] is not a string (list): keys are names"),
    ("a: [1, 2\nb: 3\n", "f.yaml:2: not valid YAML: expected ',' or ']', but got ':' (column 2)"),
    ("a: 1\nb: \x07\n", "f.yaml:2: not YAML text: special characters are not allowed (character #x0007)"),
])
def test_refused_in_one_line_naming_file_and_line(text, message):
    with pytest.raises(LockError) as err:
        load_yaml(text, source="f.yaml", error=LockError)
    assert str(err.value) == message


def test_what_plain_yaml_reads_is_read_the_same():
    text = "base: &b {x: 1, y: [1, 2]}\nc:\n  <<: *b\n  x: 2\n'1': quoted\nempty:\n"
    assert load_yaml(text, source="f") == yaml.safe_load(text) == {
        "base": {"x": 1, "y": [1, 2]}, "c": {"x": 2, "y": [1, 2]}, "1": "quoted", "empty": None}
    assert load_yaml("", source="f") is None and load_yaml("- a\n", source="f") == ["a"]


def test_read_yaml_names_the_file_for_an_encoding_or_a_size(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_bytes(b"name: caf\xe9\n")  # latin-1
    with pytest.raises(SpecError, match=rf"^{path}: not UTF-8 text \(byte 9\); save the run spec as UTF-8$"):
        read_yaml(path, what="run spec")
    path.write_bytes("\ufeffname: café\n".encode())  # a UTF-8 byte order mark is UTF-8
    assert read_yaml(path) == {"name": "café"}
    with pytest.raises(SpecError, match="far more than a run spec"):
        read_yaml(path, what="run spec", max_bytes=4)
    with pytest.raises(FileNotFoundError):
        read_yaml(tmp_path / "missing.yaml")


def test_json_refuses_a_key_given_twice():
    with pytest.raises(SpecError, match=r"^p\.json: key 'b' is given twice in one object: keep one$"):
        load_json('{"a": {"b": 1, "b": 2}}', source="p.json")
    assert load_json(b'{"a": [1, {"b": null}]}', source="p") == {"a": [1, {"b": None}]}
    with pytest.raises(json.JSONDecodeError):
        load_json("{", source="p")


# ------------------------------------------------------------------------------------------ FlashRL configs
@pytest.fixture
def flashrl_config(tmp_path) -> Path:
    """A FlashRL config that activation accepts (absolute model and profile paths that exist)."""
    model = tmp_path / "int8"
    model.mkdir()
    (tmp_path / "profile.pt").write_bytes(b"p")
    path = tmp_path / "flashrl.yaml"
    path.write_text(yaml.safe_dump({"configs": [{"fn": "int8", "model": str(model),
                                                 "profile": str(tmp_path / "profile.pt")}]}))
    return path


def test_activation_refuses_a_flashrl_config_with_a_key_given_twice(flashrl_config):
    """FlashRL's own yaml.safe_load would take the last `fn` (bf16: the run silently not int8); the activation in
    every verl worker refuses the file instead, naming it and the line (as it refuses unreadable YAML)."""
    from rollout8.node.activation import ActivationError, check_flashrl_config

    assert check_flashrl_config(str(flashrl_config)) == (str(flashrl_config), "int8")
    lines = flashrl_config.read_text().splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines, 1) if "fn: int8" in ln)
    lines.insert(first, lines[first - 1].replace("- fn: int8", "  fn: bf16"))
    flashrl_config.write_text("".join(lines))
    with pytest.raises(ActivationError) as err:
        check_flashrl_config(str(flashrl_config))
    assert str(err.value) == (f"FLASHRL_CONFIG={flashrl_config} is not readable YAML: {flashrl_config}:{first + 1}: "
                              f"key 'fn' is given twice (first at line {first}): keep one")


def test_activation_refuses_a_flashrl_config_with_a_key_that_is_not_a_string(flashrl_config):
    from rollout8.node.activation import ActivationError, check_flashrl_config

    flashrl_config.write_text(flashrl_config.read_text() + "1: x\n")
    line = len(flashrl_config.read_text().splitlines())
    with pytest.raises(ActivationError, match=rf"{flashrl_config}:{line}: key 1 is not a string \(int\)"):
        check_flashrl_config(str(flashrl_config))


def test_a_flashrl_config_in_a_log_tree_is_read_strictly(flashrl_config):
    """`rollout8 logs` takes a run's mode from a FlashRL config among the logs; one with a key given twice did not
    run as read (activation refuses it), so it says nothing about the mode (verl's own YAML reads as before)."""
    from rollout8.results.verl_logs import mode_from_config

    assert mode_from_config(flashrl_config) == ("int8", "FlashRL config flashrl.yaml")
    flashrl_config.write_text(flashrl_config.read_text().replace("fn: int8", "fn: int8\n  fn: bf16"))
    assert mode_from_config(flashrl_config) is None
    hydra = flashrl_config.with_name("config.yaml")
    hydra.write_text("trainer:\n  nnodes: 2\n  logger: [console]\nactor_rollout_ref:\n  rollout: {mode: sync}\n")
    assert mode_from_config(hydra) is None


# ------------------------------------------------------------------------------------------------ JSON
def test_the_plan_with_a_key_given_twice_is_refused(tmp_path):
    from rollout8.runspec.plan import load_plan

    path = tmp_path / "rollout8-plan.json"
    path.write_text('{"schema": 1, "name": "a", "name": "b"}')
    with pytest.raises(SpecError, match=rf"^{path}: key 'name' is given twice in one object: keep one$"):
        load_plan(path)


def test_a_model_json_with_a_key_given_twice_is_refused(tmp_path):
    from rollout8.quant.checkpoint import read_json

    path = tmp_path / "config.json"
    path.write_text('{"torch_dtype": "bfloat16", "torch_dtype": "float16"}')
    with pytest.raises(ModelError, match=rf"^{path}: key 'torch_dtype' is given twice in one object: keep one$"):
        read_json(path, "config.json")


# ------------------------------------------------------------------ bounded (issue 45): aliases, self-reference, depth
def _laughs(levels: int) -> str:
    """Nested aliases: each level a list of ten of the one before, 10**levels values once expanded."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, message", [
    (_laughs(9), "f.yaml:5: its aliases (*name) expand to more than 100,000 values"),  # (where it passes them)
    ("a: &a [1, *a]\n", "f.yaml:1: a value that contains itself (an alias inside its own anchor)"),
    ("a: &a {b: *a}\n", "f.yaml:1: a value that contains itself"),
    ("a: " + "[" * 80 + "]" * 80 + "\n", "f.yaml:1: nested more than 64 levels deep"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "f.yaml: nested too deep to read"),
    # an alias placed deeper than its anchor: 40 levels, then that under 40 more
    ("a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n",
     "nested more than 64 levels deep once its aliases are expanded"),
])
def test_what_expands_without_bound_is_refused_in_one_line_and_fast(text, message):
    import time

    start = time.monotonic()
    with pytest.raises(SpecError) as err:
        load_yaml(text, source="f.yaml")
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert time.monotonic() - start < 5  # bounded: billions of values are never built


def test_aliases_and_merge_keys_within_the_bounds_still_load():
    assert load_yaml(_laughs(3), source="f.yaml")["l3"][0][0][0] == ["x"] * 10
    assert load_yaml("base: &b {x: 1, y: 2}\nrun:\n  <<: *b\n  y: 3\n", source="f.yaml")["run"] == {"x": 1, "y": 3}
    assert load_yaml("a: " + "[" * 60 + "]" * 60 + "\n", source="f.yaml") is not None


def test_a_named_pipe_or_a_directory_is_refused_before_it_is_read(tmp_path, capsys):
    import os

    from rollout8.cli import main

    pipe = tmp_path / "spec.yaml"
    os.mkfifo(pipe)  # a read would block forever: nobody writes
    with pytest.raises(SpecError, match="a named pipe, not a run spec"):
        read_yaml(pipe, what="run spec")
    assert main(["check", "--no-artifacts", str(pipe)]) != 0
    err = capsys.readouterr().err
    assert "a named pipe, not a run spec" in err and "Traceback" not in err
    with pytest.raises(SpecError, match="a directory, not a FlashRL config"):
        read_yaml(tmp_path, what="FlashRL config")


def test_a_run_spec_of_nested_aliases_is_refused_by_check_in_one_line(tmp_path, capsys):
    from rollout8.cli import main

    spec = tmp_path / "laughs.yaml"
    spec.write_text(_laughs(9) + "name: x\n")
    assert main(["check", "--no-artifacts", str(spec)]) != 0
    err = capsys.readouterr().err.strip()
    assert "expand to more than 100,000 values" in err and len(err.splitlines()) == 1, err
