"""Proof by equivalence on the corpus (issue 44 item 4): every NPU launch script of verl at the pin
(tests/unit/fixtures/verl_scripts/, made by scripts/import-corpus.py; corpus.json says what each is) is run by real
bash, with every command that would launch or touch the system replaced by a recorder, and imported by `rollout8
import` in the same environment; the hydra overrides verl would receive from bash are those the imported spec
renders, rollout8's own additions named and set aside. A script the importer refuses is refused in one line
naming its line and what it is. The import itself runs nothing: with PATH holding only recorders for every command
name of the corpus, no recording appears.

docs/import-corpus.md is this tier's table; `ROLLOUT8_REGEN_CORPUS_TABLE=1` rewrites it, otherwise it is checked.

The environment both sides get (ENV): HOME, a temporary directory, and nothing else. Bash also gets PATH, a
directory holding only links to the harmless coreutils (SAFE) — everything else, python3, ray, torchrun,
nvidia-smi, npu-smi, ifconfig included, is caught by bash's command_not_found_handle, which records its argv and
exported environment and succeeds — and BASH_ENV, which defines that handler and makes `source .../set_env.sh`
(CANN's, absent here) a recorded no-op.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from rollout8.cli import main
from rollout8.runspec.importer import canonical, differences, parse_override, rendered_overrides
from rollout8.runspec.render import render
from rollout8.runspec.runspec import load_spec
from rollout8.runspec.shell_script import MEGATRON_CONFIG, OTHER_CONFIG, read_script
from rollout8.runspec.shell_words import logical_lines

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "verl_scripts"
MANIFEST = json.loads((FIXTURES / "corpus.json").read_text())
SCRIPTS = {item["fixture"]: item for item in MANIFEST["scripts"]}
CORPUS = [name for name, item in SCRIPTS.items() if item["kind"] == "corpus"]
TABLE = ROOT / "docs" / "import-corpus.md"
HEADER = MANIFEST["header_lines"]
SAFE = ("mkdir", "date", "dirname", "basename", "cat", "tee", "pwd", "head", "tail", "tr", "cut", "sed", "grep",
        "awk", "wc", "env", "printf", "echo", "true", "false", "ls", "expr", "seq", "realpath", "readlink")
BASH_ENV = r"""
__r8_record() { local f="$R8_REC/$(date +%s%N).$$.$RANDOM"; printf '%s\0' "$@" > "$f.argv"; env -0 > "$f.env"; }
command_not_found_handle() { __r8_record "$@"; return 0; }
source() { case "$1" in */set_env.sh) __r8_record source "$@"; return 0;; esac; builtin source "$@"; }
"""
BASH_OWN = {"PWD", "OLDPWD", "SHLVL", "_", "PATH", "BASH_ENV", "R8_REC", "HOME"}


@dataclass
class Outcome:
    name: str
    code: int
    err: str
    launch: list[str] = field(default_factory=list)  # what bash ran: the trainer's argv
    equal: list[str] = field(default_factory=list)  # overrides bash and the render give verl alike
    unequal: list[str] = field(default_factory=list)  # key: bash ..., render ...
    set_aside: list[str] = field(default_factory=list)  # render's own additions (key=value)
    env_unequal: list[str] = field(default_factory=list)
    env_set_aside: list[str] = field(default_factory=list)  # the script's variables rollout8 sets itself


@cache
def workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="r8-corpus-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def bash_run(name: str) -> tuple[list[list[str]], dict[str, str], Path]:
    """Every recorded command of the script run by bash (argv), the environment of the trainer's command, HOME."""
    work = workdir() / name
    home, rec, bin_ = work / "home", work / "rec", work / "bin"
    for directory in (home, rec, bin_, work / "cwd"):
        directory.mkdir(parents=True)
    for tool in SAFE:
        real = shutil.which(tool)
        if real:
            (bin_ / tool).symlink_to(real)
    (work / "bash_env").write_text(BASH_ENV)
    env = {"HOME": str(home), "PATH": str(bin_), "BASH_ENV": str(work / "bash_env"), "R8_REC": str(rec)}
    subprocess.run(["/bin/bash", str(FIXTURES / name)], cwd=work / "cwd", env=env, capture_output=True, timeout=30)
    calls, trainer_env = [], {}
    for argv in sorted(rec.glob("*.argv")):
        calls.append(argv.read_bytes().decode().split("\0")[:-1])
        if trainer_module(calls[-1]):
            pairs = (item.split("=", 1) for item in argv.with_suffix(".env").read_bytes().decode().split("\0") if item)
            trainer_env = {k: v for k, v in pairs if k not in BASH_OWN}
    return calls, trainer_env, home


def trainer_module(argv: list[str]) -> str | None:
    if argv[:3] == ["ray", "job", "submit"] and "--" in argv:
        argv = argv[argv.index("--") + 1:]
    return argv[2] if argv[:1] in (["python3"], ["python"]) and argv[1:2] == ["-m"] and len(argv) > 2 else None


@cache
def outcome(name: str) -> Outcome:
    calls, trainer_env, home = bash_run(name)
    launch = next((c for c in calls if trainer_module(c)), [])
    out = workdir() / name / "spec.yaml"
    err_file = workdir() / name / "import.err"
    code = run_import(name, home, out, err_file)
    result = Outcome(name, code, err_file.read_text(), launch)
    if code != 0:
        return result
    argv = launch[launch.index("--") + 1:] if "--" in launch else launch
    bash_side = {}
    for arg in argv[3:]:
        parsed = parse_override(arg)
        if parsed:
            bash_side[parsed[1]] = (parsed[0], parsed[2])
    spec = load_spec(out)
    rendered = render(spec)
    mine = rendered_overrides(rendered)
    for key, (op, value) in sorted(bash_side.items()):
        other = mine.get(key)
        if other is not None and other[0] == op and canonical(other[1]) == canonical(value):
            result.equal.append(key)
        else:
            result.unequal.append(f"{op}{key}: bash {canonical(value)}, render "
                                  f"{other and other[0] + canonical(other[1])}")
    result.set_aside = [f"{mine[k][0]}{k}" for k in sorted(mine) if k not in bash_side]
    for var, value in sorted(trainer_env.items()):
        if rendered.env.get(var) == value:
            continue
        owned = [d for d in read_import_notes(result.err) if d.startswith(f"{var}=")]
        (result.env_set_aside if owned else result.env_unequal).append(f"{var}={value}")
    # the importer's own account agrees: what it calls rollout8's own is what the render adds
    reading = read_script(FIXTURES / name, {"HOME": str(home)})
    ours = {d.name.lstrip("+~") for d in differences(spec, reading) if d.ours and d.kind == "override"}
    result.unequal += [f"{k}: set aside but not rollout8's own" for k in result.set_aside if k.lstrip("+~") not in ours
                       and k.lstrip("+~") not in _verl_default_equal(spec, reading)]
    return result


def _verl_default_equal(spec, reading) -> set[str]:
    """Keys render sets that the importer does not call a difference: verl's default, which the script leaves."""
    named = {d.name.lstrip("+~") for d in differences(spec, reading)}
    return {k for k in rendered_overrides(render(spec)) if k not in named}


def read_import_notes(err: str) -> list[str]:
    """The `noted:`/`not carried:` items of the import's output, as `VAR=value` (the text after the last ': ')."""
    return [line.rsplit(": ", 1)[-1] for line in err.splitlines() if line.startswith(("noted:", "not carried:"))]


def run_import(name: str, home: Path, out: Path, err_file: Path) -> int:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["import", str(FIXTURES / name), "--env", f"HOME={home}", "-o", str(out)])
    err_file.write_text(err.getvalue())
    return code


# ---------------------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("name", CORPUS)
def test_a_corpus_script_imports_to_the_overrides_bash_gives_verl_or_is_refused_naming_its_line(name):
    result = outcome(name)
    assert result.launch, f"bash ran no trainer command for {name}"
    if result.code == 0:
        assert result.unequal == [] and result.env_unequal == [], (result.unequal, result.env_unequal)
        assert len(result.equal) >= 10
    else:
        assert re.search(rf"{re.escape(name)}:\d+", result.err), result.err  # names the line


@pytest.mark.parametrize("name", [n for n, item in SCRIPTS.items() if item["kind"] != "corpus"])
def test_sft_sglang_and_ray_helper_scripts_are_refused_in_one_line_saying_what_they_are(name):
    result = outcome(name)
    assert result.code == 2
    line = result.err.strip()
    assert len(line.splitlines()) == 1, line
    kind = SCRIPTS[name]["kind"]
    assert {"sft": "an SFT launch", "sglang": "rollout.name=sglang", "ray-helper": "only Ray cluster helpers"}[kind] \
        in line


def test_every_main_ppo_script_imports_equal_unless_it_composes_another_hydra_config():
    """verl.trainer.main_ppo scripts import with equal overrides, except one that picks another config (megatron's,
    a multi-turn one) by --config-name: not carried, named with its line. A recipe's own trainer is refused, saying
    why it cannot run under rollout8 (the image has no `recipe` package; docs/import-corpus.md, "Recipe trainers")."""
    main_ppo = [n for n in CORPUS if trainer_module(outcome(n).launch) == "verl.trainer.main_ppo"]
    equal = [n for n in main_ppo if outcome(n).code == 0]
    assert len(main_ppo) >= 15 and len(equal) >= 13, (len(equal), len(main_ppo))
    for name in set(main_ppo) - set(equal):
        assert outcome(name).code == 1 and "hydra options --config-path" in outcome(name).err
    megatron = "tests__special_npu__run_qwen2_5_05b_grpo_mindspeed.sh"
    assert MEGATRON_CONFIG in outcome(megatron).err, outcome(megatron).err
    assert "tests__special_npu__run_qwen2_5_05b_grpo.sh" in equal  # its FSDP twin, which the reason points to
    multiturn = "examples__sglang_multiturn__run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh"
    assert OTHER_CONFIG in outcome(multiturn).err, outcome(multiturn).err
    for name in set(CORPUS) - set(main_ppo):
        assert trainer_module(outcome(name).launch).startswith("recipe.")
        assert "a verl recipe's own trainer (python3 -m recipe." in outcome(name).err
        assert "rollout8's image has no `recipe` package" in outcome(name).err


def command_names() -> set[str]:
    """Every word at a command's place in the corpus (and the usual launchers), for the recorders."""
    names = {"python", "python3", "ray", "torchrun", "bash", "sh", "nvidia-smi", "npu-smi", "pip", "pip3", "git",
             "curl", "wget", "rm", "docker", "ssh", "hostname", "ifconfig", "ip", "nproc", "ps", "kill", "pkill"}
    for path in FIXTURES.glob("*.sh"):
        for _, line in logical_lines(path.read_text()):
            for part in re.split(r"\|\|?|&&|;|\$\(|`|\bthen\b|\bdo\b|\belse\b", line):
                words = [w for w in part.split() if not re.match(r"\w+\+?=", w)]
                if words and re.fullmatch(r"[A-Za-z][\w.+-]*", words[0]):
                    names.add(words[0])
    return names


def test_importing_the_corpus_runs_nothing(tmp_path):
    recorders, log = tmp_path / "bin", tmp_path / "ran"
    recorders.mkdir()
    log.mkdir()
    names = command_names()
    assert {"python3", "ray", "ulimit", "ifconfig"} <= names
    for name in names:
        tool = recorders / name
        tool.write_text(f"#!/bin/sh\necho \"$0 $*\" > {log}/{name}.$$\n")
        tool.chmod(0o755)
    control = subprocess.run(["/bin/sh", "-c", "python3 -V"], env={"PATH": str(recorders)})
    assert control.returncode == 0 and [p.name.split(".")[0] for p in log.iterdir()] == ["python3"]  # they record
    shutil.rmtree(log)
    log.mkdir()
    program = ("import sys\nfrom rollout8.cli import main\n"
               "for script in sys.argv[1:]:\n    main(['import', script, '--env', 'HOME=/home/r8', '-o', "
               f"{str(tmp_path / 'spec.yaml')!r}, '--accept-dropped'])\n")
    env = {"PATH": str(recorders), "HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", program, *map(str, sorted(FIXTURES.glob("*.sh")))], env=env,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and done.stdout.count("wrote ") >= 15, done.stderr[-2000:]
    assert sorted(p.name for p in log.iterdir()) == []


# ---------------------------------------------------------------------------------------------- the table
def _where(text: str, name: str) -> str:
    """A refusal's fixture path and line as the upstream file's path and line."""
    source = SCRIPTS[name]["source"]
    text = re.sub(rf"\S*{re.escape(name)}:(\d+)", lambda m: f"{source}:{int(m.group(1)) - HEADER}", text)
    text = text.replace(str(FIXTURES / name), source).replace(f"tests/unit/fixtures/verl_scripts/{name}", source)
    return re.sub(r"/\S*r8-corpus-\S*?/home", "$HOME", text)


def table() -> str:
    lines = ["# `rollout8 import` on verl's NPU launch scripts",
             "",
             f"Generated by tests/unit/test_import_corpus.py (`ROLLOUT8_REGEN_CORPUS_TABLE=1 .venv/bin/python -m "
             f"pytest tests/unit/test_import_corpus.py`); do not edit. The corpus: every `.sh` under "
             f"{', '.join(MANIFEST['roots'])} of verl at {MANIFEST['verl_commit'][:7]} (the pin) whose path or text "
             "says npu or ascend, kept verbatim in tests/unit/fixtures/verl_scripts/ (scripts/import-corpus.py).",
             "",
             "Each script is run by real bash (every command that launches or touches the system recorded, not run; "
             "HOME a temporary directory) and imported with the same `--env HOME=...`; *equal* means every hydra "
             "override bash hands the trainer is in the imported spec's render with the same value, and every "
             "variable the script exports is in the render's environment with the same value, or is one rollout8 "
             "sets itself (set aside). *Set aside* are the overrides render adds that the script does not give "
             "(rollout8's own: rollout mode, TIS, checkpoints, paths it owns) and the script's variables rollout8 "
             "sets itself. Line numbers are the upstream file's.",
             "",
             "| script | trainer | result | set aside |",
             "|---|---|---|---|"]
    counts = {"equal": 0, "refused": 0, "not carried": 0}
    for name, item in SCRIPTS.items():
        result = outcome(name)
        module = trainer_module(result.launch) or "-"
        if result.code == 0 and not result.unequal and not result.env_unequal:
            what, counts["equal"] = f"imported, {len(result.equal)} overrides equal", counts["equal"] + 1
            aside = ", ".join(f"`{k}`" for k in result.set_aside + [v.split('=')[0] for v in result.env_set_aside])
        elif result.code == 2:
            what, counts["refused"] = "refused: " + _where(result.err.strip(), name).replace("rollout8 import: "
                                                                                              "error: ", ""), \
                counts["refused"] + 1
            aside = ""
        else:
            lines_ = [_where(line, name) for line in result.err.splitlines() if line.startswith("not carried:")]
            what, counts["not carried"] = f"exit {result.code}, " + "; ".join(lines_ + result.unequal), \
                counts["not carried"] + 1
            aside = ""
        kind = "" if item["kind"] == "corpus" else f" ({item['kind']}, outside the corpus)"
        lines.append(f"| {item['source']}{kind} | {module} | {what.replace('|', '/')} | {aside} |")
    corpus = len(CORPUS)
    equal = sum(outcome(n).code == 0 for n in CORPUS)
    modules = [trainer_module(outcome(n).launch) or "-" for n in CORPUS]
    recipes = {m: modules.count(m) for m in sorted(set(modules)) if m.startswith("recipe.")}
    main_ppo = modules.count("verl.trainer.main_ppo")
    configs = [n for n in CORPUS if "hydra options --config-path" in outcome(n).err]
    lines += ["", f"Corpus (GRPO/DAPO/PPO with vLLM): {corpus} scripts, {equal} imported with equal overrides "
              f"({100 * equal // corpus}%); of the {len(SCRIPTS) - corpus} outside it, every one refused in one "
              f"line. {sum(recipes.values())} launch a verl recipe's own trainer and are refused (below): the most "
              f"this corpus can import at the pin is its {main_ppo} `verl.trainer.main_ppo` scripts "
              f"({100 * main_ppo // corpus}%), under issue 44's 90%."]
    lines += ["", "## Recipe trainers", "",
              "A script that launches a verl recipe's own trainer (`python3 -m recipe.<name>.main_*`) is refused on "
              "purpose: none of them can run under rollout8 at the pin, so a spec for one would describe a job that "
              "cannot start. Read in verl 51d2104:",
              "",
              "- **No recipe in the image.** The image installs verl as the wheel built from the pinned commit "
              "(docker/Dockerfile, stack-build stage 5). verl's setup.py packages `find_packages()`, and recipe/ has "
              "no `__init__.py`, so the wheel holds `verl/` (and `scripts/`, `tests/`) but no `recipe` package "
              "(checked by building the wheel at the pin; `tests/image/test_stack.py` holds the image to it). A "
              "recipe's hydra config also finds `ppo_trainer` through `file://verl/trainer/config`, relative to the "
              "working directory: only a verl source checkout as the working directory satisfies it, and the image "
              "holds none.",
              f"- `recipe.dapo.main_dapo` ({recipes.get('recipe.dapo.main_dapo', 0)} scripts): `RayDAPOTrainer.fit` "
              "calls `self.async_rollout_manager.generate_sequences` unconditionally, and verl creates that manager "
              "only with `actor_rollout_ref.rollout.mode=async`; FlashRL patches only `vllm.LLM`, the sync rollout "
              "rollout8 renders (stack facts, trap 1). Even with the recipe in the image, DAPO with int8 rollouts "
              "fails at its first rollout in sync mode, or silently rolls out in bf16 in async mode. Its reward "
              "shaping is verl's own (`reward_model.reward_manager=dapo`; `main_ppo` passes "
              "`reward_model.reward_kwargs.*`, e.g. `max_resp_len` and `overlong_buffer_cfg`, to it) and its clip "
              "and loss settings are actor keys of ppo_trainer, so those can be written into a `main_ppo` spec by hand "
              "(the reward kwargs as `+reward_model.reward_kwargs.*` adds, which `check` accepts for the names the "
              "chosen reward manager's `__init__` takes: the dapo manager's `max_resp_len` and `overlong_buffer_cfg`); "
              "dynamic sampling (`algorithm.filter_groups.*`) exists only in `RayDAPOTrainer`. rollout8 "
              "has not run that combination.",
              f"- `recipe.one_step_off_policy.main_ppo` ({recipes.get('recipe.one_step_off_policy.main_ppo', 0)}): "
              "rollout workers of its own, separate from the actor, with their own weight sync (NCCL broadcast, its "
              "`fsdp_workers.py`): a path not proven with FlashRL's patched `load_weights`.",
              f"- `recipe.r1_ascend.main_ppo` ({recipes.get('recipe.r1_ascend.main_ppo', 0)}): runs on its own "
              "patched copies of vLLM v0.9.1, vllm-ascend 8c7bc45 and MindSpeed f6688 copied into the verl tree "
              "(its README, its own Dockerfile): another stack than the lock's.",
              f"- `recipe.transfer_queue.main_ppo` ({recipes.get('recipe.transfer_queue.main_ppo', 0)}): needs the "
              "TransferQueue package (verl's `transferqueue` extra, a git dependency), which the lock does not "
              "carry.",
              "",
              "Carrying a recipe would take all of: the image copying the pinned recipe/ tree and the launch running "
              "it from a verl source tree; a spec field naming the trainer module, rendered into launch.sh, with "
              "`check` validating keys against that recipe's own config (`algorithm.filter_groups.*`, "
              "`reward_model.overlong_buffer.*`); and for each recipe, its trainer proven with FlashRL's sync "
              "rollout. The refusal's reasons live in `rollout8.commands.import` (`NO_RECIPE`, `RECIPE_TRAINERS`).",
              "",
              "## Other trainer configs",
              "",
              f"{len(configs)} `verl.trainer.main_ppo` scripts pick another hydra config with `--config-name`; the "
              "line is not carried (exit 1, named with its line), and the reason says why:",
              "",
              "- **`ppo_megatron_trainer`** (tests/special_npu/run_qwen2_5_05b_grpo_mindspeed.sh): verl's own "
              "Megatron config, in the verl wheel the image installs, and the image has Megatron-LM core_v0.12.1 and "
              "MindSpeed 1cdd0ab (versions.lock.yaml, docker/Dockerfile stage 4). It is still not carried: "
              "rollout8's render, `check` and its key table are verl's FSDP config `ppo_trainer`'s. Read in verl "
              "51d2104, `_generated_ppo_megatron_trainer.yaml` has 482 keys, 121 of them not in ppo_trainer "
              "(`actor_rollout_ref.actor.megatron.*` and the rest; its actor is `McoreActorConfig`), and check's "
              "batch rules are the FSDP workers' (every rank a data-parallel rank; under Megatron the actor's "
              "data-parallel size is the world over TP x PP x CP). And rollout8 has run FlashRL's int8 weight sync "
              "with the FSDP actor only: the Megatron worker hands vLLM the same `update_weights` stream, but "
              "through Megatron/MindSpeed's weight export, which no run here has exercised (the CPU tier runs the "
              "FSDP actor). The script's FSDP twin, tests/special_npu/run_qwen2_5_05b_grpo.sh (the same run, "
              "`strategy` fsdp), imports equal. Carrying it would take: a spec field naming verl's config "
              "(allow-listed to the wheel's trainer configs), rendered as `--config-name`; check validating against "
              "that config (a key table generated from the pin's `_generated_ppo_megatron_trainer.yaml`, hydra "
              "composing it) with Megatron's parallel and batch rules; and FlashRL's sync proven through the "
              "Megatron export on an NPU.",
              "- **a config outside verl's wheel** (examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_"
              "fsdp.sh: `--config-path=$PROJECT_DIR/examples/sglang_multiturn/config`, a verl source checkout as "
              "the working directory): the image holds no verl source tree, and rollout8 composes ppo_trainer. "
              "Carrying its settings as overrides would not make it the same run: it is a multi-turn tool rollout, "
              "which verl at the pin runs in its agent loop (`verl/experimental/agent_loop/tool_agent_loop.py`, "
              "the async rollout), not in the sync rollout FlashRL patches. The script also stops at `ulimit` and "
              "`$(pwd)`.",
              "",
              "The reasons live in `rollout8.runspec.shell_script` (`MEGATRON_CONFIG`, `OTHER_CONFIG`)."]
    return "\n".join(lines) + "\n"


def test_the_corpus_table_in_docs_is_current():
    text = table()
    if os.environ.get("ROLLOUT8_REGEN_CORPUS_TABLE") == "1":
        TABLE.write_text(text)
    assert TABLE.read_text() == text, "docs/import-corpus.md is stale: ROLLOUT8_REGEN_CORPUS_TABLE=1 rewrites it"


def test_the_corpus_is_verl_at_the_locks_pin():
    """The fixtures name the commit they came from; a new git.verl pin makes them stale until regenerated
    (scripts/import-corpus.py VERL)."""
    from rollout8.lock import load_lock

    pin = load_lock(ROOT / "versions.lock.yaml").git["verl"].commit
    assert MANIFEST["verl_commit"] == pin, "regenerate the corpus: scripts/import-corpus.py <verl checkout>"
    for script in sorted(FIXTURES.glob("*.sh")):
        assert f" at commit {pin}," in script.read_text().splitlines()[0], script.name
