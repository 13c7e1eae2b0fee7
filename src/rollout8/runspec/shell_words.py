"""The words of one line of bash, as the shell would pass them to a command: quotes removed, parameters
expanded from the variables assigned so far (never by running anything), operators and redirections apart.

What cannot be known without running the script (command substitution, arithmetic, $?, ${#VAR}, subshells)
raises Dynamic with its reason; shell_script then lists the line as not carried.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)


class Dynamic(Exception):
    """A construct the static reader does not follow (its reason, e.g. 'command substitution')."""


@dataclass
class Shell:
    """One shell process: its variables and which of them are exported."""

    variables: dict[str, str]
    exported: list[str]
    where: dict[str, str] = field(default_factory=dict)  # variable -> "file:line" of its last assignment

    def export(self, name: str) -> None:
        if name not in self.exported:
            self.exported.append(name)

    def environment(self) -> dict[str, str]:
        return {name: self.variables[name] for name in self.exported if name in self.variables}

    def child(self) -> Shell:
        env = self.environment()
        return Shell(dict(env), list(env), {k: v for k, v in self.where.items() if k in env})


# ---------------------------------------------------------------------------------------------- lines
def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with backslash-newline continuations joined; comments stay for the tokenizer."""
    out: list[tuple[int, str]] = []
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not buffer:
            start = number
        stripped = raw.rstrip()
        if stripped.endswith("\\") and not stripped.endswith("\\\\") and not stripped.lstrip().startswith("#"):
            buffer += stripped[:-1] + " "
            continue
        out.append((start, buffer + raw))
        buffer = ""
    if buffer:
        out.append((start, buffer))
    return out


# ---------------------------------------------------------------------------------------------- tokens
OPERATORS = ("&&", "||", ";;", "|&", "|", ";", "&")


class Tokenizer:
    """Words (quotes removed, parameters expanded) and operators of one logical line."""

    def __init__(self, text: str, shell: Shell, unresolved: list[str]) -> None:
        self.text, self.shell, self.unresolved = text, shell, unresolved
        self.i = 0

    def tokens(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        text = self.text
        while self.i < len(text):
            ch = text[self.i]
            if ch in " \t":
                self.i += 1
            elif ch == "#":
                break
            elif text.startswith(OPERATORS, self.i):
                op = next(o for o in OPERATORS if text.startswith(o, self.i))
                self.i += len(op)
                out.append(("op", op))
            elif ch in "<>" or (ch.isdigit() and re.match(r"\d+[<>]", text[self.i:])) or text.startswith("&>", self.i):
                self._redirect()
                out.append(("redir", ""))
            elif ch in "()":
                raise Dynamic("subshell or function definition")
            else:
                out.extend(("word", w) for w in self._word())
        return out

    def _redirect(self) -> None:
        match = re.match(r"(\d*|&)(>>|>&|<&|>|<)(-|\d+)?", self.text[self.i:])
        assert match is not None
        self.i += match.end()
        if match.group(3) is None:  # a target word follows (a file name): read and discard it
            while self.i < len(self.text) and self.text[self.i] in " \t":
                self.i += 1
            self._word()

    def _word(self) -> list[str]:
        words: list[str] = []
        current, quoted, at_only = "", False, False
        text = self.text
        while self.i < len(text):
            ch = text[self.i]
            if ch in " \t" or text.startswith(OPERATORS, self.i) or ch in "<>()":
                break
            if ch == "'":
                end = text.find("'", self.i + 1)
                if end < 0:
                    raise Dynamic("unterminated single quote")
                current += text[self.i + 1:end]
                quoted, self.i = True, end + 1
            elif ch == '"':
                current, at = self._double(current)
                quoted, at_only = True, at_only or at
            elif ch == "\\":
                current += text[self.i + 1:self.i + 2]
                self.i += 2
            elif ch == "`":
                raise Dynamic("command substitution")
            elif ch == "$":
                value, at = self._dollar()
                at_only = at_only or at
                if ASSIGNMENT.match(current) is None:
                    parts = value.split()  # an unquoted expansion is split into words, as bash does
                    if parts and value[:1].isspace() and current:
                        words.append(current)
                        current = ""
                    if len(parts) > 1:
                        words.append(current + parts[0])
                        words.extend(parts[1:-1])
                        current = parts[-1]
                    else:
                        current += parts[0] if parts else ""
                else:
                    current += value
            else:
                current += ch
                self.i += 1
        if current or (quoted and not at_only):
            words.append(current)
        return words

    def _double(self, current: str) -> tuple[str, bool]:
        text, at = self.text, False
        self.i += 1
        while self.i < len(text):
            ch = text[self.i]
            if ch == '"':
                self.i += 1
                return current, at
            if ch == "\\" and text[self.i + 1:self.i + 2] in ('"', "\\", "$", "`"):
                current += text[self.i + 1]
                self.i += 2
            elif ch == "`":
                raise Dynamic("command substitution")
            elif ch == "$":
                value, was_at = self._dollar()
                current, at = current + value, at or was_at
            else:
                current += ch
                self.i += 1
        raise Dynamic("unterminated double quote")

    def _dollar(self) -> tuple[str, bool]:
        """Expand the parameter at self.i ('$'); (text, whether it was $@ / $*)."""
        text = self.text
        rest = text[self.i + 1:]
        if rest.startswith("(("):
            raise Dynamic("arithmetic expansion")
        if rest.startswith("("):
            raise Dynamic("command substitution")
        if rest[:1] in ("@", "*"):
            self.i += 2
            return "", True
        if rest[:1].isdigit() or rest[:1] == "#":
            self.i += 2
            return "", False  # read as run with no arguments
        if rest[:1] in ("$", "?", "!", "-"):
            raise Dynamic(f"the shell's own ${rest[:1]}")
        if rest.startswith("{"):
            end = text.find("}", self.i)
            if end < 0:
                raise Dynamic("unterminated ${")
            inner = text[self.i + 2:end]
            self.i = end + 1
            return self._braced(inner), inner in ("@", "*")
        match = NAME.match(rest)
        if not match:
            self.i += 1
            return "$", False
        self.i += 1 + match.end()
        return self._lookup(match.group(0)), False

    def _braced(self, inner: str) -> str:
        if inner in ("@", "*") or re.fullmatch(r"\d+|#", inner):
            return ""
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|\d+)(:?[-=])?(.*)", inner, re.DOTALL)
        if not match or (match.group(3) and not match.group(2)):
            raise Dynamic(f"parameter expansion ${{{inner}}}")
        name, op, default = match.groups()
        if "$(" in default or "`" in default:
            raise Dynamic("command substitution")
        value = None if name.isdigit() else self.shell.variables.get(name)
        if not op:
            return self._lookup(name) if not name.isdigit() else ""
        unset = value is None or (op.startswith(":") and value == "")
        if not unset:
            return value or ""
        expanded = Tokenizer(default, self.shell, self.unresolved).expand_text()
        if op.endswith("=") and not name.isdigit():
            self.shell.variables[name] = expanded
        return expanded

    def _lookup(self, name: str) -> str:
        if name in self.shell.variables:
            return self.shell.variables[name]
        self.unresolved.append(name)
        return "$" + name  # kept as written: the nodes' environment may set it

    def expand_text(self) -> str:
        """A default's text (inside ${...}) expanded as a double-quoted string."""
        self.text = '"' + self.text.replace('"', '\\"') + '"'
        self.i = 0
        return self._double("")[0]


