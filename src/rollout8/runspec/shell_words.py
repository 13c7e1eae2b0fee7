"""The words of one line of bash, as bash would pass them to a command: quotes removed, parameters and arithmetic
expanded from the variables known so far (never by running anything), fields split, operators and redirections
apart. shell_expand does the `${...}` / `$(( ))` work, shell_arith the arithmetic, shell_script the lines.

| construct | read as bash does | named as not carried (Dynamic) |
|---|---|---|
| quoting | `'...'`, `"..."`, `\\x`; quotes inside `${...}` (inside `"..."` too) | `$'...'` |
| parameters | `$X`, `${X}`, `$#` (0), `$1`, `$@`, `$*` (run with no arguments: empty) | `$?` `$$` `$!` `$-` |
| defaults | `${X:-w}` `${X-w}` `${X:=w}` `${X=w}` `${X:+w}` `${X+w}` `${X:?w}`; w quoted, nested | `${X:?w}`, X unset |
| patterns | `${X#p}` `${X##p}` `${X%p}` `${X%%p}` `${X/p/r}` `${X//p/r}` `${X/#p/r}` `${X/%p/r}` | extglob |
| (globs) | `*`, `?`, `[...]`, `[!...]`; quoted characters literal; `&` in r is the match (bash 5.2) | |
| others | `${X^^}` `${X,,}` `${X^}` `${X,}` `${#X}` `${X:off:len}` `${!X}` | `${X^^p}` `${!X*}` `${X@Q}` |
| arithmetic | `$(( ))`, 64-bit: every bash operator, names with or without `$` | unset names, `/ 0` |
| arrays | `a=(x "y z")`, `a+=(v)`, `"${a[@]}"`, `${a[*]}`, `${#a[@]}`, `${a[i]}`, per element | `a[i]=v` |
| words | field splitting on blanks; `~` is `$HOME` (given by --env, else named) | globbing: kept literal |
| commands | `;`, `&&`, `||` after a test, `| tee`, redirections (targets ignored) | `$(...)`, backticks |
| | | `(...)`, `((...))` |

An unset variable with no default is kept as written (`$HOME`) and named: the nodes' environment may set it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .shell_expand import BREAK, EXP, LIT, Dynamic, Piece, Q, brace_end, braced, glob_regex, paren_end, skip_quoted
from .shell_expand import arithmetic as arithmetic_value

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
DECLARE = {"export", "declare", "local", "readonly", "typeset"}
BLANK = " \t\n"
__all__ = ["ASSIGNMENT", "NAME", "Assign", "Dynamic", "Shell", "Tokenizer", "logical_lines"]


@dataclass
class Shell:
    """One shell process: its variables (strings and indexed arrays) and which of them are exported."""

    variables: dict[str, str]
    exported: list[str]
    where: dict[str, str] = field(default_factory=dict)  # variable -> "file:line" of its last assignment
    arrays: dict[str, list[str]] = field(default_factory=dict)

    def get(self, name: str) -> str | None:
        if name in self.arrays:
            return self.arrays[name][0] if self.arrays[name] else None
        return self.variables.get(name)

    def set(self, name: str, value: str) -> None:
        if name in self.arrays:
            self.arrays[name][:1] = [value]
        else:
            self.variables[name] = value

    def elements(self, name: str) -> list[str] | None:
        if name in self.arrays:
            return list(self.arrays[name])
        return None if name not in self.variables else [self.variables[name]]

    def set_array(self, name: str, values: list[str], append: bool = False) -> None:
        old = self.elements(name) or [] if append else []
        self.variables.pop(name, None)
        self.arrays[name] = old + values

    def unset(self, name: str) -> None:
        self.variables.pop(name, None)
        self.arrays.pop(name, None)
        if name in self.exported:
            self.exported.remove(name)

    def export(self, name: str) -> None:
        if name not in self.exported:
            self.exported.append(name)

    def environment(self) -> dict[str, str]:
        return {name: self.variables[name] for name in self.exported if name in self.variables}

    def child(self) -> Shell:
        env = self.environment()
        return Shell(dict(env), list(env), {k: v for k, v in self.where.items() if k in env})


class Word(str):
    """A word of `[[ ... ]]`, with the glob its unquoted characters make (the right side of == and !=)."""

    pattern: str

    def __new__(cls, text: str, pattern: str) -> Word:
        word = super().__new__(cls, text)
        word.pattern = pattern
        return word


@dataclass(frozen=True)
class Assign:
    """NAME=value, NAME+=value, NAME=(...) or NAME+=(...) before a command's name (or alone)."""

    name: str
    value: str | list[str]
    append: bool = False


# ---------------------------------------------------------------------------------------------- lines
def _open(text: str) -> bool:
    """Whether text ends inside a quote or an unclosed `(` / `${` (the command goes on on the next line)."""
    depth, i = 0, 0
    try:
        while i < len(text):
            ch = text[i]
            if ch == "\\":
                i += 2
            elif ch == "#" and (i == 0 or text[i - 1] in BLANK + ";&|("):
                end = text.find("\n", i)
                i = len(text) if end < 0 else end
            elif ch == "'":
                end = text.find("'", i + 1)
                if end < 0:
                    return True
                i = end + 1
            elif ch == '"':
                i = skip_quoted(text, i)
            elif text.startswith("${", i):
                i = brace_end(text, i + 2, False) + 1
            else:
                depth += {"(": 1, ")": -1}.get(ch, 0)
                i += 1
    except Dynamic:
        return True
    return depth > 0


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with backslash-newline continuations joined, and the lines of a quote or an
    array `a=( ... )` that spans lines; comments stay for the tokenizer."""
    out: list[tuple[int, str]] = []
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not buffer:
            start = number
        stripped = raw.rstrip()
        if stripped.endswith("\\") and not stripped.endswith("\\\\") and not stripped.lstrip().startswith("#"):
            buffer += stripped[:-1] + " "
            continue
        if _open(buffer + raw) and number - start < 200:
            buffer += raw + "\n"
            continue
        out.append((start, buffer + raw))
        buffer = ""
    if buffer:
        out.append((start, buffer))
    return out


# ---------------------------------------------------------------------------------------------- fields
def fields(pieces: list[Piece], split: bool = True) -> list[str]:
    """Bash's field splitting (IFS unset: blanks) of a word's pieces; an empty unquoted expansion is no field."""
    out: list[str] = []
    current, exists = "", False
    for text, kind in pieces:
        if (text, kind) == BREAK:
            out.append(current)
            current, exists = "", False
        elif kind != EXP or not split:  # unsplit (`[[ $X ]]`): an expansion is one word, even empty
            current, exists = current + text, exists or kind == Q or bool(text) or not split
        else:
            for number, part in enumerate(re.split(r"[ \t\n]+", text)):
                if number and (exists or current):
                    out.append(current)
                    current, exists = "", False
                current, exists = current + part, exists or bool(part)
    if exists or current:
        out.append(current)
    return out


# ---------------------------------------------------------------------------------------------- tokens
OPERATORS = ("&&", "||", ";;", "|&", "|", ";", "&")


class Tokenizer:
    """Words (quotes removed, parameters expanded), assignments and operators of one logical line."""

    def __init__(self, text: str, shell: Shell, unresolved: list[str]) -> None:
        self.text, self.shell, self.unresolved = text, shell, unresolved
        self.i = 0
        self.command: list[str | Assign] = []
        self.in_test = False  # inside `[[ ... ]]`, across its && and ||

    def tokens(self) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        text = self.text
        while self.i < len(text):
            ch = text[self.i]
            if ch in BLANK:
                self.i += 1
            elif ch == "#":
                end = text.find("\n", self.i)
                self.i = len(text) if end < 0 else end
            elif text.startswith(OPERATORS, self.i):
                op = next(o for o in OPERATORS if text.startswith(o, self.i))
                self.i += len(op)
                out.append(("op", op))
                self.command = []
            elif ch in "<>" or (ch.isdigit() and re.match(r"\d+[<>]", text[self.i:])) or text.startswith("&>", self.i):
                self._redirect()
                out.append(("redir", ""))
            elif text.startswith("((", self.i):
                raise Dynamic("an arithmetic command (( ))")
            elif ch in "()":
                raise Dynamic("a subshell or function definition")
            else:
                for item in self._word():
                    self.command.append(item)
                    out.append(("assign" if isinstance(item, Assign) else "word", item))
        return out

    def _redirect(self) -> None:
        match = re.match(r"(\d*|&)(>>|>&|<&|>|<)(-|\d+)?", self.text[self.i:])
        assert match is not None
        self.i += match.end()
        if match.group(3) is None:  # a target word follows (a file name): read and discard it
            while self.i < len(self.text) and self.text[self.i] in " \t":
                self.i += 1
            saved, self.command = self.command, ["<redirect>"]
            self._word()
            self.command = saved

    def _word(self) -> list[str | Assign]:
        """One word: its fields, or the assignment it is."""
        text = self.text
        eligible = all(isinstance(item, Assign) for item in self.command)
        command = next((item for item in self.command if isinstance(item, str)), None)
        pieces: list[Piece] = []
        at, assign = False, None
        while self.i < len(text):
            ch = text[self.i]
            if ch in BLANK or text.startswith(OPERATORS, self.i) or ch in "<>()":
                if ch == "(" and assign and eligible and not pieces[1:]:
                    return [Assign(assign[0], self._array(), assign[1])]
                break
            if ch == "=" and assign is None and len(pieces) == 1 and pieces[0][1] == LIT:
                match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)", pieces[0][0])
                assign = (match.group(1), bool(match.group(2))) if match else ("", False)
                pieces = [(pieces[0][0] + "=", LIT)]
                self.i += 1
                if assign[0] and (eligible or command in DECLARE):
                    pieces = [("", LIT)]  # the value alone from here
                    if self.i < len(text) and text[self.i] == "~":
                        pieces += self._tilde()
                continue
            if ch == "~" and not pieces:
                pieces += self._tilde()
                continue
            new, was_at = self._part(quoted=False)
            at = at or was_at
            if new and new[0][1] == LIT and pieces and pieces[-1][1] == LIT:
                pieces[-1] = (pieces[-1][0] + new[0][0], LIT)
                new = new[1:]
            pieces += new
        if assign and assign[0] and eligible:
            return [Assign(assign[0], self.joined(pieces), assign[1])]
        if assign and assign[0] and command in DECLARE:
            return [assign[0] + ("+=" if assign[1] else "=") + self.joined(pieces)]
        if self.in_test or (not self.command and self.joined(pieces) == "[["):  # `[[ ... ]]`: no splitting
            self.in_test = self.joined(pieces) != "]]"
            return [Word(self.joined(pieces), glob_regex(pieces))]
        return list(fields(pieces))

    def _tilde(self) -> list[Piece]:
        """A leading `~` (alone or before `/`): $HOME, which only --env gives."""
        rest = self.text[self.i + 1:self.i + 2]
        if rest and rest not in "/:" + BLANK:
            self.i += 1
            return [("~", LIT)]
        self.i += 1
        value = self.shell.get("HOME")
        if value is None:
            self.unresolved.append("HOME")
            return [("$HOME", Q)]
        return [(value, Q)]

    def _array(self) -> list[str]:
        """The elements of `=( ... )` at self.i ('('), each word expanded and split as bash does."""
        text, elements = self.text, []
        self.i += 1
        saved, self.command = self.command, ["<array>"]
        while self.i < len(text):
            ch = text[self.i]
            if ch in BLANK:
                self.i += 1
            elif ch == "#":
                end = text.find("\n", self.i)
                self.i = len(text) if end < 0 else end
            elif ch == ")":
                self.i += 1
                self.command = saved
                return elements
            else:
                elements += [str(w) for w in self._word()]
                if self.i < len(text) and text[self.i] not in BLANK + ")":
                    raise Dynamic(f"an array element with {text[self.i]!r}")
        raise Dynamic("an array without its closing )")

    def _part(self, quoted: bool, pattern: bool = False) -> tuple[list[Piece], bool]:
        """The pieces of one quote, escape, expansion or literal character at self.i; whether it was "$@"-like."""
        text, ch = self.text, self.text[self.i]
        if ch == "'" and (not quoted or pattern):
            end = text.find("'", self.i + 1)
            if end < 0:
                raise Dynamic("unterminated single quote")
            part, self.i = text[self.i + 1:end], end + 1
            return [(part, Q)], False
        if ch == '"':
            return self._double()
        if ch == "\\":
            following = text[self.i + 1:self.i + 2]
            self.i += 2
            if quoted and following not in '"\\$`}':
                return [("\\" + following, Q)], False
            return [(following, Q)], False
        if ch == "`":
            raise Dynamic("command substitution `...`")
        if ch == "$":
            return self._dollar(quoted)
        self.i += 1
        return [(ch, LIT)], False

    def _double(self) -> tuple[list[Piece], bool]:
        """A double-quoted string at self.i; it makes a field even when empty, unless it held "$@"."""
        text, pieces, at = self.text, [], False
        self.i += 1
        while self.i < len(text):
            ch = text[self.i]
            if ch == '"':
                self.i += 1
                return pieces + ([] if at else [("", Q)]), at
            if ch == "\\" and text[self.i + 1:self.i + 2] in ('"', "\\", "$", "`"):
                pieces.append((text[self.i + 1], Q))
                self.i += 2
            elif ch == "`":
                raise Dynamic("command substitution `...`")
            elif ch == "$":
                new, was_at = self._dollar(quoted=True)
                pieces, at = pieces + new, at or was_at
            else:
                pieces.append((ch, Q))
                self.i += 1
        raise Dynamic("unterminated double quote")

    def _dollar(self, quoted: bool) -> tuple[list[Piece], bool]:
        """Expand what starts at self.i ('$'); (pieces, whether it was "$@" or "${a[@]}")."""
        text, start = self.text, self.i
        rest = text[start + 1:]
        kind = Q if quoted else EXP
        if rest.startswith("(("):
            end = paren_end(text, start + 2)
            if text[end - 2:end] == "))":
                self.i = end
                return [(str(arithmetic_value(self, text[start + 3:end - 2])), kind)], False
        if rest.startswith("("):
            end = paren_end(text, start + 2)
            raise Dynamic(f"command substitution {text[start:end]}")
        if rest.startswith("{"):
            end = brace_end(text, start + 2, quoted)
            self.i = end + 1
            return braced(self, text[start + 2:end], quoted)
        if rest.startswith("'") and not quoted:
            raise Dynamic("ANSI-C quoting $'...'")
        if rest.startswith('"') and not quoted:
            self.i += 1
            return self._double()
        if rest[:1] in ("@", "*"):
            self.i += 2
            return [], quoted and rest[0] == "@"
        if rest[:1].isdigit() or rest[:1] == "#":
            self.i += 2
            return [("0" if rest[0] == "#" else "", kind)], False  # read as run with no arguments
        if rest[:1] in ("$", "?", "!", "-"):
            raise Dynamic(f"the shell's own ${rest[:1]}")
        match = NAME.match(rest)
        if not match:
            self.i += 1
            return [("$", LIT)], False
        self.i += 1 + match.end()
        name = match.group(0)
        value = self.shell.get(name)
        if value is None:
            self.unresolved.append(name)
            return [("$" + name, Q)], False  # kept as written: the nodes' environment may set it
        return [(value, kind)], False

    # ------------------------------------------------------------------------------------------ for shell_expand
    def word_pieces(self, text: str, quoted: bool, pattern: bool = False) -> list[Piece]:
        """The pieces of the word of an operator (`${x:-word}`), read whole; `quoted` if the `${...}` is in "..."."""
        sub = Tokenizer(text, self.shell, self.unresolved)
        pieces: list[Piece] = []
        while sub.i < len(text):
            new, _ = sub._part(quoted, pattern)
            for piece in new:  # neighbours of one kind as one piece: a glob's `[...]` is read whole
                if pieces and piece != BREAK and pieces[-1] != BREAK and pieces[-1][1] == piece[1]:
                    pieces[-1] = (pieces[-1][0] + piece[0], piece[1])
                else:
                    pieces.append(piece)
        return pieces

    @staticmethod
    def joined(pieces: list[Piece]) -> str:
        return "".join(" " if (text, kind) == BREAK else text for text, kind in pieces)
