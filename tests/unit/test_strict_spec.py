"""Strict everywhere in the run spec and the lock (issue 30): numbers are finite, a nested `verl:` section is the
dotted keys it stands for (one key given both ways refused), the deploy root is a directory of the run's own, and
every text file the lock reads is UTF-8 or refused naming it.

The refusals run the real CLI (`rollout8.cli.main`) on a copy of one valid workspace, as tests/unit/test_bad_input.py
does: exit non-zero, one `rollout8 CMD: error:` line naming the field, no traceback, nothing changed.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from workspace import SPEC, make_workspace

from rollout8.cli import main
from rollout8.errors import LockError, SpecError
from rollout8.runspec.check_common import Collector
from rollout8.runspec.check_verl import check_verl_keys
from rollout8.runspec.render import render
from rollout8.runspec.runspec import parse_spec
from rollout8.runspec.verl_keys import Override, hydra_value, value_problem

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
REPO = Path(__file__).resolve().parents[2]
ROLLOUT = "actor_rollout_ref.rollout."


@pytest.fixture(scope="module")
def pristine(model_pair, tmp_path_factory) -> Path:
    """bf16/, int8/, profile.pt, data/ and spec.yaml (valid: `rollout8 check` passes it)."""
    return make_workspace(tmp_path_factory.mktemp("pristine"), model_pair, RAW)


RAW = SPEC


def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def refused(argv: list[str], w: Path, capsys) -> tuple[str, str]:
    """Run `rollout8 ARGV` ({w}: the workspace): refused in one error line, no traceback, nothing changed.
    Returns (the error line, everything printed)."""
    before = snapshot(w)
    rc = main([a.replace("{w}", str(w)) for a in argv])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith(f"rollout8 {argv[0]}: error:")]
    assert rc != 0, out + err
    assert "Traceback" not in out + err, err
    assert len(lines) == 1, err
    assert snapshot(w) == before, "an input was changed or something was left behind"
    return lines[0], out + err


def workspace(pristine: Path, tmp_path: Path, change: Callable[[dict], None] | None = None,
              text: Callable[[str], str] | None = None) -> Path:
    """A copy of the workspace, its spec changed as a mapping (change) or as text (text)."""
    w = tmp_path / "w"
    shutil.copytree(pristine, w)
    spec = w / "spec.yaml"
    if change is not None:
        raw = yaml.safe_load(spec.read_text())
        change(raw)
        spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    if text is not None:
        spec.write_text(text(spec.read_text()))
    return w


def verl_set(key: str, value) -> Callable[[dict], None]:
    return lambda raw: raw["verl"].update({key: value})


def nested_verl(raw: dict) -> None:
    """The same overrides as nested sections (and the first two as dotted keys)."""
    raw["verl"] = {"data.train_batch_size": 6, "actor_rollout_ref": {
        "actor": {"ppo_mini_batch_size": 6, "ppo_micro_batch_size_per_gpu": 2},
        "rollout": {"n": 2, "tensor_model_parallel_size": 1}}}


# ------------------------------------------------------------------ refused through `rollout8 check`, one line each
CHECK_CASES = [
    # NaN and infinity: YAML's .nan / .inf pass every range check (nan < 0 and nan > 1 are both false)
    ("memory-utilization-nan", dict(change=verl_set(ROLLOUT + "gpu_memory_utilization", float("nan"))),
     f"verl.{ROLLOUT}gpu_memory_utilization: nan is not a finite number"),
    ("temperature-inf", dict(change=verl_set(ROLLOUT + "temperature", float("inf"))),
     f"verl.{ROLLOUT}temperature: inf is not a finite number"),
    ("temperature-minus-inf-nested", dict(change=lambda r: r["verl"].update(
        {"actor_rollout_ref": {"rollout": {"temperature": float("-inf")}}})),
     f"verl.{ROLLOUT}temperature: -inf is not a finite number"),
    ("nan-in-a-list", dict(change=verl_set("trainer.logger", ["console", float("nan")])),
     "verl.trainer.logger[1]: nan is not a finite number"),
    ("env-inf", dict(change=lambda r: r.update(env={"X": float("inf")})), "env.X: inf is not a finite number"),
    ("nan-as-yaml-text", dict(text=lambda t: t.replace("rollout.n: 2", "rollout.n: .NaN")),
     f"verl.{ROLLOUT}n: nan is not a finite number"),
    # one key given twice: nested and dotted, or with two operators
    ("nested-and-dotted", dict(change=lambda r: r["verl"].update({"actor_rollout_ref": {"rollout": {"n": 4}}})),
     f"verl: {ROLLOUT}n is given twice, as '{ROLLOUT}n' and nested as actor_rollout_ref: {{rollout: {{n: ...}}}}"),
    ("plus-and-plain", dict(change=verl_set("+" + ROLLOUT + "n", 4)),
     f"verl: {ROLLOUT}n is given twice, as '{ROLLOUT}n' and as '+{ROLLOUT}n'"),
    # paths on every node
    ("shared-dir-relative", dict(change=lambda r: r["cluster"].update(shared_dir="relative/dir")),
     "cluster.shared_dir: 'relative/dir' must be an absolute path"),
    ("shared-dir-dot-dot", dict(change=lambda r: r["cluster"].update(shared_dir="/mnt/../etc")),
     "cluster.shared_dir: '/mnt/../etc' has a '..' segment"),
    ("root-slash", dict(change=lambda r: r.update(deploy={"root": "/"})), "deploy.root: '/' is / (the whole"),
    ("root-double-slash", dict(change=lambda r: r.update(deploy={"root": "//"})), "deploy.root: '//' is / (the whole"),
    ("root-usr", dict(change=lambda r: r.update(deploy={"root": "/usr"})), "deploy.root: '/usr' is a system directory"),
    ("root-var-lib", dict(change=lambda r: r.update(deploy={"root": "/var/lib/"})),
     "deploy.root: '/var/lib/' is a system directory"),
    ("root-home-of-a-user", dict(change=lambda r: r.update(deploy={"root": "/home/alice"})),
     "deploy.root: '/home/alice' is a system directory"),
    ("root-tmp", dict(change=lambda r: r.update(deploy={"root": "/tmp"})), "deploy.root: '/tmp' is a system directory"),
    ("root-dev-shm", dict(change=lambda r: r.update(deploy={"root": "/dev/shm/run"})),
     "deploy.root: '/dev/shm/run' lies inside /dev"),
    ("root-ascend", dict(change=lambda r: r.update(deploy={"root": "/usr/local/Ascend/r8"})),
     "deploy.root: '/usr/local/Ascend/r8' lies inside /usr/local/Ascend"),
    ("root-every-runs-parent", dict(change=lambda r: r.update(deploy={"root": "/var/lib/rollout8/runs"})),
     "deploy.root: '/var/lib/rollout8/runs' holds every run's default deploy root"),
    ("root-dot-dot", dict(change=lambda r: r.update(deploy={"root": "/srv/rollout8/../../etc"})),
     "deploy.root: '/srv/rollout8/../../etc' has a '..' segment"),
    ("root-with-a-newline", dict(change=lambda r: r.update(deploy={"root": "/srv/r8\n/x"})),
     "deploy.root: '/srv/r8\\n/x' holds a control character"),
    ("root-with-a-space", dict(change=lambda r: r.update(deploy={"root": "/srv/my runs/t"})),
     "deploy.root: '/srv/my runs/t' holds a space"),
    ("root-inside-shared-dir", dict(change=lambda r: (r["cluster"].update(shared_dir="/mnt/shared"),
                                                      r.update(deploy={"root": "/mnt/shared/runs/t"}))),
     "deploy.root '/mnt/shared/runs/t' lies inside cluster.shared_dir '/mnt/shared'"),
    ("root-is-the-shared-dir", dict(change=lambda r: (r["cluster"].update(shared_dir="/mnt/shared/"),
                                                      r.update(deploy={"root": "/mnt/shared"}))),
     "deploy.root '/mnt/shared' is cluster.shared_dir '/mnt/shared'"),
    ("default-root-inside-shared-dir", dict(change=lambda r: r["cluster"].update(shared_dir="/var/lib/rollout8")),
     "deploy.root (default '/var/lib/rollout8/runs/t') lies inside cluster.shared_dir '/var/lib/rollout8'"),
    ("shared-dir-inside-root", dict(change=lambda r: (r["cluster"].update(shared_dir="/srv/r8/checkpoints"),
                                                      r.update(deploy={"root": "/srv/r8"}))),
     "cluster.shared_dir '/srv/r8/checkpoints' lies inside deploy.root '/srv/r8'"),
]


@pytest.mark.parametrize("broken, names", [c[1:] for c in CHECK_CASES], ids=[c[0] for c in CHECK_CASES])
def test_check_refuses_in_one_line_naming_the_field(broken, names, pristine, tmp_path, capsys):
    w = workspace(pristine, tmp_path, **broken)
    line, _ = refused(["check", "{w}/spec.yaml"], w, capsys)
    assert line.startswith(f"rollout8 check: error: {w}/spec.yaml: {names}"), line
    assert "give " in line or "keep one" in line or "absolute path" in line, f"what to do? {line}"


def test_render_and_plan_refuse_the_same_deploy_root(pristine, tmp_path, capsys):
    w = workspace(pristine, tmp_path, change=lambda r: r.update(deploy={"root": "/etc"}))
    for argv in (["render", "{w}/spec.yaml", "-o", "{w}/out"], ["plan", "{w}/spec.yaml", "-o", "{w}/plan"]):
        line, _ = refused(argv, w, capsys)
        assert "deploy.root: '/etc' is a system directory" in line, line


def test_text_that_reads_as_infinity_is_a_finding_not_a_crash(pristine, tmp_path, capsys):
    """`data.train_batch_size: inf` is the text "inf" (YAML's infinity is .inf): float() reads it, int() of it
    overflowed in the batch rule ("unexpected OverflowError"). Now: the value's finding, and the batch rule's."""
    w = workspace(pristine, tmp_path,
                  text=lambda t: t.replace("data.train_batch_size: 6", "data.train_batch_size: inf"))
    _, printed = refused(["check", "{w}/spec.yaml"], w, capsys)
    assert "error: verl.data.train_batch_size: 'inf' is not an integer [batch]" in printed, printed
    assert "unexpected" not in printed


def test_a_model_config_that_is_not_an_object_is_refused_naming_it(pristine, tmp_path, capsys):
    """config.json holding a list: the MoE rule read it as a mapping ("unexpected AttributeError"); now check's model
    rule names it."""
    w = workspace(pristine, tmp_path)
    (w / "bf16" / "config.json").write_text("[1, 2]\n")
    _, printed = refused(["check", "{w}/spec.yaml"], w, capsys)
    assert f"{w}/bf16/config.json" in printed and "unexpected" not in printed, printed


# ------------------------------------------------------------------ a nested `verl:` section is its dotted keys
def test_nested_verl_renders_and_checks_exactly_as_the_dotted_keys(pristine, tmp_path):
    """Decision: flatten, not refuse (verl_keys.flatten): the nested form is how verl's own YAML reads. The same spec
    written both ways is the same spec: same overrides, same command line, same checkpoint key, same findings."""
    dotted = copy.deepcopy(RAW)
    dotted["cluster"]["shared_dir"] = "/mnt/shared"
    nested = copy.deepcopy(dotted)
    nested_verl(nested)
    dotted["verl"] = {"data.train_batch_size": 6, "actor_rollout_ref.actor.ppo_mini_batch_size": 6,
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2, ROLLOUT + "n": 2,
                      ROLLOUT + "tensor_model_parallel_size": 1}
    a, b = parse_spec(dotted, pristine), parse_spec(nested, pristine)
    assert a.verl == b.verl == dotted["verl"]
    assert render(a).argv == render(b).argv
    assert a.checkpoint_dir == b.checkpoint_dir
    assert f"{ROLLOUT}n=2" in render(b).argv and not any(arg.startswith("actor_rollout_ref=") for arg in render(b).argv)


@pytest.mark.parametrize("nested, dotted", [
    ({"actor_rollout_ref": {"rollout": {"gpu_memory_utilization": 30}}}, {ROLLOUT + "gpu_memory_utilization": 30}),
    ({"actor_rollout_ref.rollout": {"gpu_memory_utilization": "lots"}}, {ROLLOUT + "gpu_memory_utilization": "lots"}),
    ({"trainer": {"total_training_step": 3}}, {"trainer.total_training_step": 3}),
    ({"actor_rollout_ref": {"rollout": {"+min_p": 0.1}}}, {"+" + ROLLOUT + "min_p": 0.1}),
])
def test_a_nested_override_gets_the_dotted_keys_findings(nested, dotted, pristine):
    def found(verl: dict) -> list[tuple[str, str, str]]:
        c = Collector()
        check_verl_keys(c, parse_spec({**RAW, "verl": verl}, pristine), None)
        return [(f.level, f.field, f.message) for f in c.findings]

    assert found(nested) == found(dotted)
    assert parse_spec({**RAW, "verl": nested}, pristine).verl == dotted


def test_what_is_a_section_and_what_is_a_value():
    """A mapping under a key with keys below it at the pin is a section; under an empty mapping (engine_kwargs.vllm),
    a '+' key or a leaf it is the key's value, left whole (and a leaf's type check refuses it)."""
    from rollout8.runspec.verl_keys import flatten

    assert flatten({"actor_rollout_ref.rollout.engine_kwargs": {"vllm": {"swap_space": 4}},
                    "+ray_kwargs.ray_init": {"num_cpus": 2},
                    ROLLOUT + "gpu_memory_utilization": {"a": 1},
                    "actor_rollout_ref": {}}) == {
        ROLLOUT + "engine_kwargs.vllm": {"swap_space": 4}, "+ray_kwargs.ray_init": {"num_cpus": 2},
        ROLLOUT + "gpu_memory_utilization": {"a": 1}, "actor_rollout_ref": {}}
    assert "a number" in value_problem(Override("", ROLLOUT + "gpu_memory_utilization", {"a": 1}))
    assert "is a section of verl's config, not a value" in value_problem(Override("", ROLLOUT + "val_kwargs", 3))
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.rollout\.n is given twice, nested as "
                                         r"actor_rollout_ref: \{rollout: \{n: \.\.\.\}\} and nested as "
                                         r"actor_rollout_ref\.rollout: \{n: \.\.\.\}: keep one$"):
        flatten({"actor_rollout_ref": {"rollout": {"n": 2}}, "actor_rollout_ref.rollout": {"n": 3}})


# ------------------------------------------------------------------ finite numbers below the loader too
def test_non_finite_values_are_refused_by_the_verl_check_and_quoted_as_text():
    """A spec built in code skips the loader: check's value rule refuses NaN too. The text 'inf' or 'nan' is quoted
    on the command line, so hydra keeps it a string instead of reading a float infinity."""
    nan = Override("", ROLLOUT + "temperature", float("nan"))
    assert value_problem(nan) == "nan is not a finite number; give a number"
    assert "holds inf" in value_problem(Override("+", "trainer.x", [1, float("inf")]))
    assert value_problem(Override("~", ROLLOUT + "temperature", None)) is None
    assert [hydra_value(v) for v in ("inf", "-Inf", "NaN", "info", "nan1", 1.5)] == [
        "'inf'", "'-Inf'", "'NaN'", "info", "nan1", "1.5"]


def test_every_float_field_of_a_model_is_finite():
    from rollout8.models import FrozenModel, StrictModel

    class Sample(StrictModel):
        ratio: float = 0.5

    class Frozen(FrozenModel):
        ratio: float = 0.5

    for model in (Sample, Frozen):
        for bad in (float("nan"), float("inf"), "nan", "-inf"):
            with pytest.raises(Exception, match="finite number"):
                model(ratio=bad)
        assert model(ratio="0.25").ratio == 0.25


# ------------------------------------------------------------------ the deploy root
def test_the_deploy_root_is_normalised(pristine):
    from rollout8.runspec.node_path import deploy_root_problem, node_absolute

    spec = parse_spec({**RAW, "deploy": {"root": "/srv//rollout8/./runs/t/"}}, pristine)
    assert spec.deploy_root == "/srv/rollout8/runs/t"
    assert spec.node_path("flashrl") == "/srv/rollout8/runs/t/flashrl.yaml"
    assert node_absolute("/mnt/shared/") == "/mnt/shared" and node_absolute("/") == "/"
    for fine in ("/var/lib/rollout8/runs/t", "/srv/rollout8", "/data/r8", "/opt/r8/runs/t", "/rollout8",
                 "/home/alice/runs", "/tmp/r8", "/mnt/disk1/r8"):
        assert deploy_root_problem(fine) is None, fine


def test_the_spec_refuses_every_deploy_root_a_node_would_refuse():
    """The node's rule (ansible/library/rollout8_deploy_root.py, before it makes the directory) refuses nothing that
    `check` lets through: a spec is refused on the controller, not half-way through a deployment."""
    from rollout8.runspec.node_path import deploy_root_problem

    pytest.importorskip("ansible")
    loader = importlib.util.spec_from_file_location("rollout8_deploy_root",
                                                    REPO / "ansible" / "library" / "rollout8_deploy_root.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    tops = sorted(module.SYSTEM_TOP | module.SYSTEM_TREES | {"rollout8", "scratch", "nfs"})
    paths = ["/"] + [f"/{t}" for t in tops] + [f"/{t}/x" for t in tops] + [f"/{t}/x/y" for t in tops]
    for path in paths:
        if module.path_problem(path, False):
            assert deploy_root_problem(path), f"{path}: the node refuses it ({module.path_problem(path, False)})"


def test_the_parse_error_names_the_field_for_a_spec_given_in_code(tmp_path):
    with pytest.raises(SpecError, match=r"^<spec>: deploy\.root: '/boot' is a system directory; the deploy root is "
                                        r"the run's alone"):
        parse_spec({**RAW, "deploy": {"root": "/boot"}}, tmp_path)
    with pytest.raises(SpecError) as err:
        parse_spec({**RAW, "env": {"A": float("nan"), "B": float("inf")}}, tmp_path, "s.yaml")
    assert str(err.value).splitlines() == ["s.yaml: env.A: nan is not a finite number; give a number",
                                           "s.yaml: env.B: inf is not a finite number; give a number"]


# ------------------------------------------------------------------ the lock's text files
@pytest.fixture
def lock_tree(tmp_path) -> Path:
    """A copy of the lock with the hashed Python lock beside it (docker/requirements/)."""
    shutil.copy(REPO / "versions.lock.yaml", tmp_path / "versions.lock.yaml")
    shutil.copytree(REPO / "docker" / "requirements", tmp_path / "docker" / "requirements")
    return tmp_path


@pytest.mark.parametrize("name", ["stack.in", "verl-x86_64.txt", "resolve-as.txt"])
def test_lock_check_names_a_python_lock_file_that_is_not_utf8(lock_tree, name, capsys):
    """It said "an input file is not UTF-8 text" without naming the file."""
    path = lock_tree / "docker" / "requirements" / name
    path.write_bytes(path.read_bytes() + b"# caf\xe9\n")
    line, _ = refused(["lock", "--lock", "{w}/versions.lock.yaml", "--check"], lock_tree, capsys)
    assert f"{path}: not UTF-8 text (byte " in line and "save the Python lock file as UTF-8" in line, line


def test_lock_refuses_a_readme_that_is_not_utf8_naming_it(lock_tree, capsys):
    readme = lock_tree / "README.md"
    readme.write_bytes(b"<!-- versions:begin -->\n<!-- versions:end -->\ncaf\xe9\n")
    line, _ = refused(["lock", "--lock", "{w}/versions.lock.yaml", "--update-readme", "{w}/README.md"],
                      lock_tree, capsys)
    assert f"{readme}: not UTF-8 text" in line, line


def test_read_text_refuses_another_encoding_naming_the_file(tmp_path):
    from rollout8.yamlio import read_text

    path = tmp_path / "a.txt"
    path.write_bytes(b"ok\n\xff\n")
    with pytest.raises(LockError, match=rf"^{path}: not UTF-8 text \(byte 3\); save the notes as UTF-8$"):
        read_text(path, what="notes", error=LockError)
    path.write_bytes("\ufeffcafé\n".encode())
    assert read_text(path) == "café\n"


# ------------------------------------------------------------------ checkpoints by the run's resume identity
@pytest.mark.parametrize("edit, resumes", [
    ({"verl": {"trainer.save_freq": 2}}, True),
    ({"env": {"FOO": "1"}}, True),
    ({"verl": {"actor_rollout_ref.actor.optim.lr": 1.0e-5}}, True),
    ({"verl": {"trainer.total_training_steps": 30}}, True),
    ({"description": "another"}, True),
    ({"verl": {"data.train_batch_size": 12}}, False),
    ({"verl": {ROLLOUT + "n": 4}}, False),
    ({"verl": {"actor_rollout_ref.actor.fsdp_config.param_offload": True}}, False),
    ({"cluster": {"nnodes": 2}}, False),
])
def test_the_checkpoint_directory_follows_what_a_checkpoint_can_be_resumed_under(edit, resumes, pristine):
    """Issue 28: a run's checkpoints are found by its identity, not by a digest of the whole spec: an edit a
    checkpoint can be resumed under keeps the directory (the resubmitted job resumes), one that changes the
    sharding, the batch shape, the model or the data gets a directory of its own (from step 0)."""
    base = copy.deepcopy(RAW)
    base["cluster"]["shared_dir"] = "/mnt/shared"
    edited = copy.deepcopy(base)
    for section, values in edit.items():
        if isinstance(values, dict):
            edited.setdefault(section, {}).update(values)
        else:
            edited[section] = values
    a, b = parse_spec(base, pristine), parse_spec(edited, pristine)
    assert a.checkpoint_dir.startswith(f"/mnt/shared/{a.name}/") and a.checkpoint_dir.endswith("/checkpoints")
    assert (a.checkpoint_dir == b.checkpoint_dir) is resumes, (a.resume_identity(), b.resume_identity())
