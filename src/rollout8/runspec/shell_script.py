"""Read a verl launch script (bash) without running it: its exported environment and its training command.

A small, static subset of bash is understood: `export VAR=value` and `VAR=value`, quoting, `$VAR`, `${VAR}`,
`${VAR:-default}`, `${VAR:=default}` (and their forms without ':'), comments, backslash continuations, a config
script the launcher `source`s, `.`s or runs with `bash`/`sh` (read in turn, its path relative to the launcher's
directory), and one `python3 -m verl.trainer.main_ppo ...` (plain, or behind `ray job submit ... --`) with its
`2>&1 | tee LOG` suffix. Nothing is executed or evaluated. Every other line (control flow, command substitution,
functions, unknown commands) is kept out and listed with its file, line and why: the reader never guesses what
a dynamic line would have done. The script is read as run with no arguments: $1, $@ are empty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecError
from ..yamlio import load_json, read_text
from .shell_words import ASSIGNMENT, NAME, Dynamic, Shell, Tokenizer, logical_lines

MAX_SCRIPT_BYTES = 1_000_000
TRAINER_MODULE = "verl.trainer.main_ppo"
OPENERS = {"if": "if", "for": "for", "while": "while", "until": "until", "case": "case", "select": "select"}
CLOSERS = {"fi", "done", "esac"}
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

    @property
    def failures(self) -> list[Dropped]:
        return [d for d in self.dropped if not d.harmless]


# ---------------------------------------------------------------------------------------------- commands
class ScriptReader:
    def __init__(self, script: Path) -> None:
        self.reading = Reading(script.absolute())
        self.base = script.absolute().parent

    def read(self) -> Reading:
        self._read_file(self.reading.script, Shell({}, []), depth=0)
        return self.reading

    def _drop(self, file: Path, line: int, text: str, reason: str, harmless: bool = False) -> None:
        self.reading.dropped.append(Dropped(file, line, " ".join(text.split())[:160], reason, harmless))

    def _read_file(self, path: Path, shell: Shell, depth: int) -> None:
        if depth > 8:
            raise SpecError(f"{path}: scripts source each other more than 8 deep (a loop?); import the inner one")
        self.reading.files.append(path)
        text = read_text(path, what="shell script", max_bytes=MAX_SCRIPT_BYTES)
        lines = logical_lines(text)
        index = 0
        while index < len(lines):
            number, line = lines[index]
            index += 1
            first = line.split(None, 1)[0] if line.split() else ""
            if not first or first.startswith("#"):
                continue
            opener = OPENERS.get(first.rstrip(";"))
            function = re.match(r"\s*(function\s+\w+|\w+\s*\(\s*\))", line)
            if opener or function:
                index = self._skip_block(path, lines, index - 1, f"a {opener} block" if opener else "a function")
                continue
            self._line(path, number, line, shell, depth)

    def _skip_block(self, path: Path, lines: list[tuple[int, str]], index: int, what: str) -> int:
        depth, start = 0, lines[index][0]
        for position in range(index, len(lines)):
            words = re.findall(r"[^\s;&|()]+|[{}]", re.sub(r"#.*", "", lines[position][1]))
            depth += sum(w in OPENERS or w == "{" for w in words) - sum(w in CLOSERS or w == "}" for w in words)
            if depth <= 0:
                end = lines[position][0]
                span = f"line {start}" if end == start else f"lines {start}-{end}"
                self._drop(path, start, lines[index][1], f"dynamic shell: {what} ({span}; its effect depends on "
                           "running it: write what it sets into the spec by hand)")
                return position + 1
        self._drop(path, start, lines[index][1], f"dynamic shell: {what} without its end (read to the end of file)")
        return len(lines)

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
        pipeline: list[list[str]] = [[]]
        for kind, value in tokens:
            if kind == "op":
                if value in ("|", "|&") and pipeline[-1]:
                    pipeline.append([])
                    continue
                if value in (";", "&&") and pipeline[-1]:
                    self._pipeline(path, number, line, pipeline, shell, depth)
                    pipeline = [[]]
                    continue
                self._drop(path, number, line, f"dynamic shell: the operator {value}")
                return
            if kind == "word":
                pipeline[-1].append(value)
        self._pipeline(path, number, line, pipeline, shell, depth)

    def _forget_assigned(self, line: str, shell: Shell) -> None:
        """A dropped assignment's variable is unknown from here on (its references stay as written)."""
        for match in re.finditer(r"(?:^|\s)(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=", line):
            shell.variables.pop(match.group(1), None)

    def _pipeline(self, path: Path, number: int, line: str, pipeline: list[list[str]], shell: Shell,
                  depth: int) -> None:
        head, rest = pipeline[0], pipeline[1:]
        for segment in rest:
            if segment[:1] != ["tee"]:
                self._drop(path, number, line, f"a pipe into {segment[0] if segment else '?'} (only `| tee LOG` "
                           "is understood)")
                return
        if head:
            self._simple(path, number, line, head, shell, depth)

    def _simple(self, path: Path, number: int, line: str, words: list[str], shell: Shell, depth: int) -> None:
        prefix: dict[str, str] = {}
        while words and ASSIGNMENT.fullmatch(words[0]) and words[0].split("=", 1)[0].isidentifier():
            name, value = words[0].split("=", 1)
            prefix[name] = value
            words = words[1:]
        if not words:  # VAR=value: a shell variable (exported if it was before)
            shell.variables.update(prefix)
            shell.where.update(dict.fromkeys(prefix, f"{path}:{number}"))
            return
        command = words[0]
        if command == "export":
            for word in words[1:]:
                if word.startswith("-"):
                    continue
                name, has_value, value = word.partition("=")
                if not NAME.fullmatch(name):
                    self._drop(path, number, line, f"export of {name!r}, not a variable name")
                    continue
                if has_value:
                    shell.variables[name] = value
                    shell.where[name] = f"{path}:{number}"
                shell.export(name)
            return
        if command == "unset":
            for name in words[1:]:
                shell.variables.pop(name, None)
                if name in shell.exported:
                    shell.exported.remove(name)
            return
        if command in ("source", ".", "bash", "sh"):
            self._nested(path, number, line, words, shell, depth, child=command in ("bash", "sh"))
            return
        if command in ("python", "python3") or words[:3] == ["ray", "job", "submit"]:
            self._training(path, number, line, words, shell, prefix)
            return
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
        env = shell.environment()
        env.update(prefix)
        if words[0] == "ray":
            if "--" not in words:
                self._drop(path, number, line, "ray job submit without `-- python3 -m ...`")
                return
            options, words = words[3:words.index("--")], words[words.index("--") + 1:]
            if not self._job_options(path, number, line, options, env):
                return
        if words[:3] not in ([w, "-m", TRAINER_MODULE] for w in ("python", "python3")):
            self._drop(path, number, line, f"a command rollout8 does not model: {' '.join(words[:3])} (rollout8 "
                       f"runs `python3 -m {TRAINER_MODULE}`)")
            return
        if self.reading.command is not None:
            self._drop(path, number, line, "a second training command (a run spec holds one; import it alone)")
            return
        args = words[3:]
        flags = [a for a in args if a.startswith("-")]
        if flags:
            self._drop(path, number, line, f"hydra options {' '.join(flags)} (rollout8 composes verl's "
                       "ppo_trainer config; carry the settings as overrides)")
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


def read_script(script: str | Path) -> Reading:
    """The script's training command, environment and every line not carried (SpecError if unreadable)."""
    path = Path(script)
    if not path.is_file():
        raise SpecError(f"{path}: no such script; give the launch script (bash)")
    return ScriptReader(path).read()
