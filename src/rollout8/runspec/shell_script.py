"""Read a verl launch script (bash) without running it: its exported environment and its training command.

The words of each line are bash's own (shell_words: quoting, every parameter expansion, arithmetic, arrays; its
docstring has the table of what is read and what is named). This module reads the lines: `VAR=value`,
`export VAR=value`, `unset`, `a=(...)`, a config script the launcher `source`s, `.`s or runs with `bash`/`sh`
(read in turn, its path relative to the launcher's directory; a missing one is named), `if`/`elif`/`else`/`fi`
and `case ... esac` whose tests the script or the given environment (`--env`, `--env-file`) decides
(shell_control: `[ ]`, `[[ ]]`, `test`, `&&`, `||`; only the branch taken is read), `[ ... ] && X=...`, and one
`python3 -m verl.trainer.main_ppo ...` (plain, or behind `ray job submit ... --`) with its `2>&1 | tee LOG`
suffix. Nothing is executed or evaluated by a shell. Every other line (a test on the nodes' files or a command's
result, loops, functions, `$(...)`, unknown commands) is kept out and listed with its file, line and why: the
reader never guesses what a dynamic line would have done. The script is read as run with no arguments ($1, $@
empty) and in the environment given, nothing else: rollout8's own $HOME is never read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecError
from ..yamlio import load_json, read_text
from . import shell_control
from .shell_control import ELSE, Node, Undecided
from .shell_expand import glob_regex, split_unquoted
from .shell_words import NAME, Assign, Dynamic, Shell, Tokenizer, logical_lines

MAX_SCRIPT_BYTES = 1_000_000
TRAINER_MODULE = "verl.trainer.main_ppo"
TESTS = {"[", "[[", "test", "true", "false", "!"}
SFT_MODULES = ("verl.trainer.fsdp_sft_trainer", "verl.trainer.sft_trainer")
# Commands with no effect on the run: skipped and listed as such, without failing the import.
HARMLESS = {"set": "shell options", "echo": "prints only", "printf": "prints only", "true": "does nothing",
            ":": "does nothing", "wait": "waits only", "sleep": "waits only"}
# Commands rollout8 does itself (or the image does): why the script's line is not carried.
OWNED_COMMANDS = {
    "ray start": "the ray role starts Ray on every node with the plan's environment",
    "ray stop": "reset.yml and the ray role stop Ray",
    "ray status": "preflight and the ray role check the cluster",
    "pip install": "the image carries the locked packages (rollout8 lock)",
    "pip3 install": "the image carries the locked packages (rollout8 lock)",
    "cd": "rollout8 runs verl from its own working directory",
    "mkdir": "rollout8 creates the run's directories (deploy.root, cluster.shared_dir)",
    "pkill": "reset.yml stops what a run started",
    "kill": "reset.yml stops what a run started",
    "ulimit": "the node's limits are the ray role's",
}
SET_ENV = "set_env.sh"
RECIPE = "a verl recipe's own trainer"  # recipe/<name>/main_*.py: its own trainer class and hydra config
GIVEN = "--env:0"  # where a variable given with --env / --env-file was set
# Why a `--config-name` is not carried (docs/import-corpus.md, "Other trainer configs"): verl's Megatron config is in
# the image's verl wheel with Megatron-LM and MindSpeed, but rollout8 renders and checks ppo_trainer only (read in
# verl 51d2104: _generated_ppo_megatron_trainer.yaml has 121 keys ppo_trainer lacks, its actor is McoreActorConfig),
# and rollout8 has run FlashRL's weight sync with the FSDP actor only.
MEGATRON_CONFIG = ("verl's Megatron trainer config: rollout8 renders and checks verl's FSDP config ppo_trainer only, "
                   "whose keys lack 121 of ppo_megatron_trainer's and whose batch rules are the FSDP workers', and "
                   "has run FlashRL's int8 weight sync with the FSDP actor only, never through Megatron/MindSpeed's "
                   "weight export; train with the FSDP actor, as tests/special_npu/run_qwen2_5_05b_grpo.sh does "
                   "for this run")
OTHER_CONFIG = ("rollout8 composes verl's ppo_trainer config, and a config outside verl's wheel is not in the image; "
                "carry the settings as overrides")


def config_options_reason(flags: list[str]) -> str:
    """Why the trainer command's hydra options (--config-path, --config-name) are not carried, in one clause."""
    name = next((f.split("=", 1)[1] for f in flags if f.startswith(("--config-name=", "-cn="))), "")
    if name.strip("'\"").removesuffix(".yaml") == "ppo_megatron_trainer":
        return MEGATRON_CONFIG
    return OTHER_CONFIG


@dataclass(frozen=True)
class Dropped:
    file: Path
    line: int
    text: str
    reason: str
    harmless: bool = False  # skipped, with nothing to carry (echo, set -x): listed, never a failure

    def describe(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}: {self.text}"


@dataclass
class Command:
    file: Path
    line: int
    args: list[str]  # the hydra overrides, as verl receives them (shell quoting removed)
    env: dict[str, str]  # the environment exported to it, in the order first exported
    where: dict[str, str] = field(default_factory=dict)  # variable -> "file:line" that set it


@dataclass
class Reading:
    script: Path
    files: list[Path] = field(default_factory=list)
    command: Command | None = None
    dropped: list[Dropped] = field(default_factory=list)
    unresolved: list[Dropped] = field(default_factory=list)  # $VAR the script never sets, kept as written
    launches: list[Dropped] = field(default_factory=list)  # other launches seen (torchrun, SFT): reason = what
    ray_helpers: list[Dropped] = field(default_factory=list)  # ray start / ray stop lines

    @property
    def failures(self) -> list[Dropped]:
        return [d for d in self.dropped if not d.harmless]


# ---------------------------------------------------------------------------------------------- commands
class ScriptReader:
    def __init__(self, script: Path, env: dict[str, str] | None = None) -> None:
        self.reading = Reading(script.absolute())
        self.base = script.absolute().parent
        self.env = dict(env or {})

    def read(self) -> Reading:
        shell = Shell(dict(self.env), list(self.env), dict.fromkeys(self.env, GIVEN))
        self._read_file(self.reading.script, shell, depth=0)
        return self.reading

    def _drop(self, file: Path, line: int, text: str, reason: str, harmless: bool = False) -> None:
        self.reading.dropped.append(Dropped(file, line, " ".join(text.split())[:160], reason, harmless))

    def _read_file(self, path: Path, shell: Shell, depth: int) -> None:
        if depth > 8:
            raise SpecError(f"{path}: scripts source each other more than 8 deep (a loop?); import the inner one")
        self.reading.files.append(path)
        text = read_text(path, what="shell script", max_bytes=MAX_SCRIPT_BYTES)
        try:
            nodes = shell_control.parse(shell_control.commands(logical_lines(text)))
        except Dynamic as exc:
            self._drop(path, 1, path.name, f"dynamic shell: {exc} (the script is not read)")
            return
        self._nodes(path, nodes, shell, depth)

    def _nodes(self, path: Path, nodes: list[Node], shell: Shell, depth: int) -> None:
        for node in nodes:
            span = f"line {node.line}" if node.end in (0, node.line) else f"lines {node.line}-{node.end}"
            if node.kind == "command":
                self._line(path, node.line, node.text, shell, depth)
            elif not node.closed:
                self._drop(path, node.line, node.text, f"dynamic shell: a {node.kind} block without its end "
                           "(read to the end of file)")
            elif node.kind == "block":
                what = shell_control.first_word(node.text)
                what = f"a {what} block" if what in shell_control.OPENERS else "a function"
                self._drop(path, node.line, node.text, f"dynamic shell: {what} ({span}; its effect depends on "
                           "running it: write what it sets into the spec by hand)")
            else:
                self._branch(path, node, span, shell, depth)

    def _branch(self, path: Path, node: Node, span: str, shell: Shell, depth: int) -> None:
        """The branch of an if or a case that the script or the given environment decides; none if undecided."""
        try:
            if node.kind == "case":
                names: list[str] = []
                tok = Tokenizer(node.text, shell, names)
                word = tok.joined(tok.word_pieces(node.text, quoted=False))
                if names:
                    raise Undecided(f"${names[0]}, which is not set (give it with --env)")
            for line, test, body in node.branches:
                if node.kind == "if":
                    taken = test == ELSE or self._condition(test, shell)
                else:
                    taken = any(re.fullmatch(glob_regex(tok.word_pieces(p, quoted=False, pattern=True)), word,
                                             re.DOTALL) for p in _alternatives(test))
                if taken:
                    self._drop(path, line, test, f"read: the {node.kind} at line {node.line} takes the branch of "
                               f"line {line}", harmless=True)
                    self._nodes(path, body, shell, depth)
                    return
        except (Undecided, Dynamic) as exc:
            self._drop(path, node.line, node.text, f"not decided: the {node.kind} ({span}) depends on {exc}; none "
                       "of its branches is read: give what it tests with --env, or write the branch's values into "
                       "the spec")
            for name in shell_control.assigned_names([node]):
                shell.unset(name)

    def _condition(self, text: str, shell: Shell) -> bool:
        names: list[str] = []
        tokens = Tokenizer(text, shell, names).tokens()
        if names:
            raise Undecided(f"${names[0]}, which is not set (give it with --env)")
        elements: list[list[str]] = [[]]
        operators: list[str] = []
        for kind, value in tokens:
            if kind == "op" and value in ("&&", "||"):
                elements.append([])
                operators.append(str(value))
            elif kind == "word":
                elements[-1].append(value)  # type: ignore[arg-type]  # a Word keeps its glob
            elif kind != "redir":
                raise Undecided(f"the condition {text!r}")
        return shell_control.and_or(elements, operators)

    def _line(self, path: Path, number: int, line: str, shell: Shell, depth: int) -> None:
        names: list[str] = []
        try:
            tokens = Tokenizer(line, shell, names).tokens()
        except Dynamic as exc:
            # `... | tee logs/$(date).log`: only the log's name is dynamic, and rollout8 keeps the job's log itself
            tee = re.search(r"\|\s*tee\b[^|;&]*$", line)
            try:
                tokens = Tokenizer(line[:tee.start()], shell, names).tokens() if tee else None
            except Dynamic:
                tokens = None
            if tokens is None:
                self._drop(path, number, line, f"dynamic shell: {exc}")
                self._forget_assigned(line, shell)
                return
        for name in dict.fromkeys(names):
            self.reading.unresolved.append(Dropped(path, number, line.strip()[:160], f"${name} is not set in the "
                                                   f"script; left as ${name}: write its value on the nodes"))
        # an and-or list: a test decides whether what follows it runs; any other command is read as succeeding
        lists: list[list[tuple[str, object]]] = [[]]
        operators: list[str] = []
        for kind, value in tokens:
            if kind == "op" and value in ("&&", "||"):
                lists.append([])
                operators.append(str(value))
            else:
                lists[-1].append((kind, value))
        status = True
        for position, part in enumerate(lists):
            if position and (operators[position - 1] == "&&") != status:
                continue
            words = [v for k, v in part if k == "word"]
            if words and words[0] in TESTS and not any(k == "assign" for k, _ in part):
                try:
                    if names:
                        raise Undecided(f"${names[0]}, which is not set (give it with --env)")
                    status = shell_control.command_truth(words)  # type: ignore[arg-type]
                except Undecided as exc:
                    self._drop(path, number, line, f"not decided: {exc}; what it guards is not read")
                    self._forget_assigned(line, shell)
                    return
                continue
            if position + 1 < len(lists) and operators[position] == "||":
                self._drop(path, number, line, "dynamic shell: the operator || after a command (whether it "
                           "fails needs running it)")
                return
            if not self._pipeline(path, number, line, part, shell, depth):
                return
            status = True

    def _forget_assigned(self, line: str, shell: Shell) -> None:
        """A dropped assignment's variable is unknown from here on (its references stay as written)."""
        for match in re.finditer(r"(?:^|\s)(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\+?=", line):
            shell.unset(match.group(1))

    def _pipeline(self, path: Path, number: int, line: str, tokens: list[tuple[str, object]], shell: Shell,
                  depth: int) -> bool:
        pipeline: list[list[str | Assign]] = [[]]
        for kind, value in tokens:
            if kind == "op":
                if value in ("|", "|&") and pipeline[-1]:
                    pipeline.append([])
                    continue
                self._drop(path, number, line, f"dynamic shell: the operator {value}")
                return False
            if kind in ("word", "assign"):
                pipeline[-1].append(value)  # type: ignore[arg-type]
        head, rest = pipeline[0], pipeline[1:]
        for segment in rest:
            if segment[:1] != ["tee"]:
                self._drop(path, number, line, f"a pipe into {segment[0] if segment else '?'} (only `| tee LOG` "
                           "is understood)")
                return False
        if head:
            self._simple(path, number, line, head, shell, depth)
        return True

    def _simple(self, path: Path, number: int, line: str, items: list[str | Assign], shell: Shell,
                depth: int) -> None:
        prefix: dict[str, str] = {}
        assigns = [item for item in items if isinstance(item, Assign)]
        words = [str(item) for item in items if not isinstance(item, Assign)]
        if not words:  # VAR=value, a=(...): a shell variable (exported if it was before)
            for item in assigns:
                if isinstance(item.value, list):
                    shell.set_array(item.name, item.value, item.append)
                else:
                    shell.set(item.name, (shell.get(item.name) or "") + item.value if item.append else item.value)
                shell.where[item.name] = f"{path}:{number}"
            return
        prefix = {item.name: item.value for item in assigns if isinstance(item.value, str)}
        command = words[0]
        if command in ("export", "declare", "typeset", "local", "readonly"):
            flags = "".join(w[1:] for w in words[1:] if w.startswith("-"))
            for word in words[1:]:
                if word.startswith("-"):
                    continue
                name, has_value, value = word.partition("=")
                if not NAME.fullmatch(name):
                    self._drop(path, number, line, f"{command} of {name!r}, not a variable name")
                    continue
                if has_value:
                    shell.set(name, value)
                    shell.where[name] = f"{path}:{number}"
                if command == "export" and "n" not in flags or "x" in flags:
                    shell.export(name)
            return
        if command == "unset":
            for name in words[1:]:
                if not name.startswith("-"):
                    shell.unset(name)
            return
        if command in ("source", ".", "bash", "sh"):
            self._nested(path, number, line, words, shell, depth, child=command in ("bash", "sh"))
            return
        if command in ("python", "python3") or words[:3] == ["ray", "job", "submit"]:
            self._training(path, number, line, words, shell, prefix)
            return
        if command in ("torchrun", "deepspeed", "accelerate"):
            module = words[words.index("-m") + 1] if "-m" in words[:-1] else ""
            what = f"an SFT launch ({command} -m {module})" if "sft" in module.lower() else f"a {command} launch"
            self.reading.launches.append(Dropped(path, number, line.strip()[:160], what))
        if words[:2] in (["ray", "start"], ["ray", "stop"]):
            self.reading.ray_helpers.append(Dropped(path, number, line.strip()[:160], " ".join(words[:2])))
        if command in HARMLESS:
            self._drop(path, number, line, f"skipped: {command} {HARMLESS[command]}", harmless=True)
            return
        two = " ".join(words[:2])
        if two in OWNED_COMMANDS or command in OWNED_COMMANDS:
            why = OWNED_COMMANDS.get(two) or OWNED_COMMANDS[command]
            shown = two if two in OWNED_COMMANDS else command
            self._drop(path, number, line, f"a command rollout8 does not model: {shown} ({why})")
            return
        self._drop(path, number, line, f"a command rollout8 does not model: {command}")

    def _nested(self, path: Path, number: int, line: str, words: list[str], shell: Shell, depth: int,
                child: bool) -> None:
        args = [w for w in words[1:] if not w.startswith("-")]
        if not args:
            self._drop(path, number, line, f"{words[0]} without a script")
            return
        target = Path(args[0])
        if target.name == SET_ENV:
            self._drop(path, number, line, "skipped: CANN's set_env.sh (the image sets CANN's environment)",
                       harmless=True)
            return
        target = target if target.is_absolute() else self.base / target
        if "${" in args[0] or not target.is_file():
            self._drop(path, number, line, f"{words[0]} {args[0]}: no such file next to the script ({target}); "
                       "import it where its config script is")
            return
        self._read_file(target, shell.child() if child else shell, depth + 1)

    def _training(self, path: Path, number: int, line: str, words: list[str], shell: Shell,
                  prefix: dict[str, str]) -> None:
        # what the user gave (--env) is the nodes' environment, not the script's: only what the script sets is carried
        env = {name: value for name, value in shell.environment().items() if shell.where.get(name) != GIVEN}
        env.update(prefix)
        if words[0] == "ray":
            if "--" not in words:
                self._drop(path, number, line, "ray job submit without `-- python3 -m ...`")
                return
            options, words = words[3:words.index("--")], words[words.index("--") + 1:]
            if not self._job_options(path, number, line, options, env):
                return
        if words[:3] not in ([w, "-m", TRAINER_MODULE] for w in ("python", "python3")):
            module = words[2] if words[1:2] == ["-m"] and len(words) > 2 else " ".join(words[:2])
            what = "an SFT launch" if module.startswith(SFT_MODULES) or "sft" in module.lower() else \
                RECIPE if module.startswith("recipe.") else "a launch"
            self.reading.launches.append(Dropped(path, number, line.strip()[:160], f"{what} ({words[0]} -m "
                                                 f"{module})" if words[1:2] == ["-m"] else f"{what} ({module})"))
            self._drop(path, number, line, f"a command rollout8 does not model: {' '.join(words[:3])} (rollout8 "
                       f"runs `python3 -m {TRAINER_MODULE}`)")
            return
        if self.reading.command is not None:
            self._drop(path, number, line, "a second training command (a run spec holds one; import it alone)")
            return
        args = words[3:]
        flags = [a for a in args if a.startswith("-")]
        if flags:
            self._drop(path, number, line, f"hydra options {' '.join(flags)} ({config_options_reason(flags)})")
            args = [a for a in args if not a.startswith("-")]
        where = {name: shell.where.get(name, f"{path}:{number}") for name in env}
        where.update(dict.fromkeys(prefix, f"{path}:{number}"))
        self.reading.command = Command(path, number, args, env, where)

    def _job_options(self, path: Path, number: int, line: str, options: list[str], env: dict[str, str]) -> bool:
        """ray job submit's options: --address and --no-wait are rollout8's (train.yml submits); a runtime env
        given as JSON carries its env_vars; anything else is not modelled."""
        index = 0
        while index < len(options):
            option = options[index]
            name, has_value, value = option.partition("=")
            takes = name in ("--address", "--runtime-env-json", "--runtime-env", "--working-dir", "--submission-id",
                             "--entrypoint-num-cpus", "--entrypoint-resources", "--metadata-json")
            if takes and not has_value and index + 1 < len(options):
                value, index = options[index + 1], index + 1
            index += 1
            if name in ("--address", "--no-wait", "--submission-id"):
                continue
            if name == "--runtime-env-json":
                try:
                    runtime = load_json(value, source=f"{path}:{number}")
                    extra = runtime.pop("env_vars", {}) if isinstance(runtime, dict) else None
                except (ValueError, SpecError):
                    runtime, extra = None, None
                if not isinstance(extra, dict):
                    self._drop(path, number, line, "--runtime-env-json that is not a JSON object with env_vars")
                    continue
                env.update({str(k): str(v) for k, v in extra.items()})
                if runtime:
                    self._drop(path, number, line, f"runtime env fields {', '.join(sorted(runtime))} (rollout8 "
                               "sets the job's runtime env)")
                continue
            self._drop(path, number, line, f"ray job submit {name} (rollout8 submits the job itself)")
        return True


def _alternatives(patterns: str) -> list[str]:
    """The patterns of a case item, split at their unquoted `|`."""
    out, rest = [], patterns
    while rest is not None:
        head, rest = split_unquoted(rest, "|")
        out.append(head.strip())
    return out


def read_script(script: str | Path, env: dict[str, str] | None = None) -> Reading:
    """The script's training command, environment and every line not carried (SpecError if unreadable); `env`
    is the environment it is read in (exported variables), nothing else."""
    path = Path(script)
    if not path.is_file():
        raise SpecError(f"{path}: no such script; give the launch script (bash)")
    return ScriptReader(path, env).read()


def read_env_file(path: str | Path) -> dict[str, str]:
    """KEY=VALUE lines as a user exports them (`export ` allowed, shell quoting, `#` comments, `$KEY` of an earlier
    line), read as bash reads them; anything else is refused naming its line."""
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"{file}: no such environment file (--env-file: KEY=VALUE lines)")
    shell = Shell({}, [])
    for number, line in logical_lines(read_text(file, what="environment file", max_bytes=MAX_SCRIPT_BYTES)):
        names: list[str] = []
        try:
            tokens = Tokenizer(line, shell, names).tokens()
        except Dynamic as exc:
            raise SpecError(f"{file}:{number}: {exc}; write the value itself") from None
        items = [value for _, value in tokens]
        if items and items[0] == "export":
            items = items[1:]
        if names or any(not isinstance(item, (Assign, str)) or isinstance(item, str) and "=" not in item
                        or isinstance(getattr(item, "value", ""), list) for item in items):
            raise SpecError(f"{file}:{number}: not a KEY=VALUE line" + (f" (${names[0]} is not set above)" if
                                                                        names else "") + f": {line.strip()[:80]}")
        for item in items:
            name, value = (item.name, item.value) if isinstance(item, Assign) else str(item).split("=", 1)
            if not NAME.fullmatch(name):
                raise SpecError(f"{file}:{number}: {name!r} is not a variable name")
            shell.set(name, str(value))
            shell.export(name)
    return shell.environment()
