"""Bash's expansions inside a word: `${...}` with every operator and its nesting, `$(( ))`, glob patterns.

A word's expansion is a list of pieces `(text, kind)`: Q (quoted: neither split nor a glob), LIT (unquoted
literal text: a glob in a pattern, never split), EXP (the unquoted result of an expansion: split into fields and a
glob in a pattern), and BREAK between the fields of `"${a[@]}"`. shell_words builds fields from them; the
supported constructs are listed in its docstring.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from .shell_arith import ArithError, evaluate

Q, LIT, EXP = "q", "lit", "exp"
BREAK = ("", "break")
Piece = tuple[str, str]
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PARAMETER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[([^\]]*)\])?|(\d+)|([@*#?$!-])")
OPERATOR = re.compile(r":[-=+?]|[-=+?]|##|#|%%|%|//|/#|/%|/|\^\^|\^|,,|,|:|@")


class Dynamic(Exception):
    """A construct the static reader does not follow (its reason, e.g. 'command substitution')."""


class Tokenizer(Protocol):
    """What the expansions need of shell_words.Tokenizer: the shell, the names left unresolved, and words."""

    shell: Any
    unresolved: list[str]

    def word_pieces(self, text: str, quoted: bool, pattern: bool = False) -> list[Piece]: ...

    def joined(self, pieces: list[Piece]) -> str: ...


# ---------------------------------------------------------------------------------------------- scanning
def skip_quoted(text: str, i: int) -> int:
    """The index after the double-quoted string that starts at text[i] ('"')."""
    i += 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
        elif ch == '"':
            return i + 1
        elif text.startswith("${", i):
            i = brace_end(text, i + 2, quoted=True) + 1
        elif text.startswith("$(", i):
            i = paren_end(text, i + 2)
        elif ch == "`":
            raise Dynamic("command substitution `...`")
        else:
            i += 1
    raise Dynamic("unterminated double quote")


def skip_construct(text: str, i: int, quoted: bool = False, strict: bool = False) -> int | None:
    """The index after what starts at text[i] and hides its separators: a backslash and the character it escapes, a
    single-quoted string (not inside double quotes: `quoted`), a double-quoted one, a `${...}` or a `$(...)`; None
    when none starts there. An unterminated single quote ends the text, or raises Dynamic when `strict`."""
    ch = text[i]
    if ch == "\\":
        return i + 2
    if ch == "'" and not quoted:
        end = text.find("'", i + 1)
        if end < 0 and strict:
            raise Dynamic("unterminated single quote")
        return len(text) if end < 0 else end + 1
    if ch == '"':
        return skip_quoted(text, i)
    if text.startswith("${", i):
        return brace_end(text, i + 2, quoted) + 1
    if text.startswith("$(", i):
        return paren_end(text, i + 2)
    return None


def brace_end(text: str, i: int, quoted: bool) -> int:
    """The index of the `}` that closes the `${` before text[i], past nested expansions and quotes."""
    while i < len(text):
        after = skip_construct(text, i, quoted, strict=True)
        if after is not None:
            i = after
        elif text[i] == "}":
            return i
        else:
            i += 1
    raise Dynamic("unterminated ${")


def paren_end(text: str, i: int) -> int:
    """The index after the `)` that closes the `(` before text[i] (nested parentheses and quotes skipped)."""
    depth = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "'":
            end = text.find("'", i + 1)
            i = len(text) if end < 0 else end + 1
            continue
        if ch == '"':
            i = skip_quoted(text, i)
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        i += 1
        if depth == 0:
            return i
    raise Dynamic("unterminated $(")


def split_unquoted(word: str, sep: str) -> tuple[str, str | None]:
    """word split at its first `sep` outside quotes and nested expansions (the `/` of ${x/p/r})."""
    i = 0
    while i < len(word):
        after = skip_construct(word, i)
        if after is not None:
            i = after
        elif word[i] == sep:
            return word[:i], word[i + 1:]
        else:
            i += 1
    return word, None


# ---------------------------------------------------------------------------------------------- patterns
def glob_regex(pieces: list[Piece]) -> str:
    """A bash pattern as a Python regex: `*`, `?` and `[...]` in unquoted pieces, everything quoted literal."""
    out: list[str] = []
    for text, kind in pieces:
        if kind == BREAK[1]:
            out.append(" ")
            continue
        if kind == Q:
            out.append(re.escape(text))
            continue
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "*":
                out.append(".*")
            elif ch == "?":
                out.append(".")
            elif ch == "[":
                end = text.find("]", i + 2 if text[i + 1:i + 2] in ("!", "^") else i + 1)
                if end < 0:
                    out.append(re.escape(ch))
                else:
                    body = text[i + 1:end]
                    negate = body[:1] in ("!", "^")
                    body = body[1:] if negate else body
                    out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\").replace("[", "\\[") + "]")
                    i = end
            else:
                out.append(re.escape(ch))
            i += 1
    return "".join(out)


def remove(value: str, regex: str, op: str) -> str:
    """${x#p} ${x##p} ${x%p} ${x%%p}."""
    pattern, n = re.compile(regex, re.DOTALL), len(value)
    if op in ("#", "##"):
        for k in (range(n + 1) if op == "#" else range(n, -1, -1)):
            if pattern.fullmatch(value, 0, k):
                return value[k:]
    else:
        for k in (range(n, -1, -1) if op == "%" else range(n + 1)):
            if pattern.fullmatch(value, k):
                return value[:k]
    return value


def substitute(value: str, regex: str, replacement: list[Piece], op: str, anchor: str) -> str:
    """${x/p/r} ${x//p/r} ${x/#p/r} ${x/%p/r}: the leftmost longest match; an unquoted & is the match (bash 5.2)."""
    pattern, n = re.compile(regex, re.DOTALL), len(value)

    def replaced(match: str) -> str:
        return "".join(text if kind == Q else text.replace("&", match) for text, kind in replacement if kind != "break")

    if not regex and not anchor:
        return value
    out, i = [], 0
    while i <= n:
        found = None
        for start in [0] if anchor == "#" else range(i, n + 1):
            end = next((e for e in ([n] if anchor == "%" else range(n, start - 1, -1))
                        if pattern.fullmatch(value, start, e)), None)
            if end is not None:
                found = start, end
                break
        if found is None:
            break
        start, end = found
        out.append(value[i:start] + replaced(value[start:end]))
        if op != "//" or anchor:
            return "".join(out) + value[end:]
        if end == start:  # an empty match: keep one character and go on
            out.append(value[start:start + 1])
        i = max(end, start + 1)
    return "".join(out) + value[i:]


# ---------------------------------------------------------------------------------------------- ${...}
def arithmetic(tok: Tokenizer, text: str) -> int:
    """The value of $(( text )): parameters expanded first, then evaluated; unknowns raise Dynamic."""
    before = len(tok.unresolved)
    expanded = tok.joined(tok.word_pieces(text, quoted=True))
    if len(tok.unresolved) > before:
        raise Dynamic(f"arithmetic on ${tok.unresolved[-1]}, which is not set")
    try:
        return evaluate(expanded, tok.shell.get, tok.shell.set)
    except ArithError as exc:
        raise Dynamic(f"$(({text})): {exc}") from None


def braced(tok: Tokenizer, inner: str, quoted: bool) -> tuple[list[Piece], bool]:
    """The pieces of ${inner} and whether it was a quoted "${a[@]}" (one field per element)."""
    shell, written = tok.shell, "${" + inner + "}"
    if inner.startswith("#") and len(inner) > 1:  # ${#x} ${#a[@]}
        values, name, _ = parameter(tok, inner[1:], written)
        if values is None:
            return unknown(tok, name, written)
        count = len(values) if isinstance(values, list) and inner.endswith(("[@]", "[*]")) else len(joined(values))
        return [(str(count), Q if quoted else EXP)], False
    if inner.startswith("!"):
        target = shell.get(inner[1:]) if NAME.fullmatch(inner[1:]) else None
        if target is None or not NAME.fullmatch(target):
            raise Dynamic(f"indirect expansion {written}")
        return braced(tok, target, quoted)
    match = PARAMETER.match(inner)
    if not match:
        raise Dynamic(f"parameter expansion {written}")
    values, name, star = parameter(tok, match.group(0), written)
    rest = inner[match.end():]
    op_match = OPERATOR.match(rest)
    if rest and not op_match:
        raise Dynamic(f"parameter expansion {written}")
    op = op_match.group(0) if op_match else ""
    word = rest[len(op):]
    unset = values is None or (isinstance(values, list) and not values)
    null = unset or joined(values) == ""
    if op in (":-", "-", ":=", "=", ":?", "?", ":+", "+"):
        empty = null if op.startswith(":") else unset
        if op.endswith("+"):
            return (([], False) if empty else word_result(tok, word, quoted))
        if not empty:
            return emit(values, quoted, star)
        if op.endswith("?"):
            raise Dynamic(f"{written}: bash stops the script here, {name} being unset")
        if op.endswith("="):
            if not NAME.fullmatch(name):
                raise Dynamic(f"{written}: cannot assign to {name}")
            value = tok.joined(tok.word_pieces(word, quoted=quoted))
            shell.set(name, value)
            return emit(value, quoted, False)
        return word_result(tok, word, quoted)
    if values is None:
        if name.isdigit():
            return [], False
        return unknown(tok, name, written)
    if not op:
        return emit(values, quoted, star)
    items = values if isinstance(values, list) else [values]
    if op in ("#", "##", "%", "%%"):
        regex = glob_regex(tok.word_pieces(word, quoted=False, pattern=True))
        items = [remove(item, regex, op) for item in items]
    elif op in ("/", "//", "/#", "/%"):
        pattern, replacement = split_unquoted(word, "/")
        regex = glob_regex(tok.word_pieces(pattern, quoted=False, pattern=True))
        pieces = tok.word_pieces(replacement or "", quoted=False, pattern=True)
        anchor = op[1:] if op in ("/#", "/%") else ""
        items = [substitute(item, regex, pieces, op[:2] if not anchor else "/", anchor) for item in items]
    elif op in ("^^", "^", ",,", ","):
        if word:
            raise Dynamic(f"case modification with a pattern {written}")
        change = str.upper if op.startswith("^") else str.lower
        items = [change(item) if len(op) == 2 else change(item[:1]) + item[1:] for item in items]
    elif op == ":" and not isinstance(values, list):
        offset, _, length = word.partition(":")
        start = arithmetic(tok, offset)
        value = values[start:] if start >= 0 else values[max(len(values) + start, 0):]
        if length:
            size = arithmetic(tok, length)
            value = value[:size] if size >= 0 else value[:max(len(value) + size, 0)]
        items = [value]
    else:
        raise Dynamic(f"parameter expansion {written} (the operator {op})")
    return emit(items if isinstance(values, list) else items[0], quoted, star)


def parameter(tok: Tokenizer, text: str, written: str) -> tuple[str | list[str] | None, str, bool]:
    """(value: a string, the elements of name[@] / name[*], None if unset; the name; whether it was [*])."""
    match = PARAMETER.fullmatch(text)
    if not match:
        raise Dynamic(f"parameter expansion {written}")
    name, subscript, index, digits, special = match.groups()
    shell = tok.shell
    if digits is not None:
        return None, digits, False
    if special in ("@", "*"):
        return [], special, special == "*"
    if special == "#":
        return "0", special, False
    if special:
        raise Dynamic(f"the shell's own ${special}")
    if subscript is None:
        return shell.get(name), name, False
    elements = shell.elements(name)
    if index in ("@", "*"):
        return elements, name, index == "*"
    position = arithmetic(tok, index)
    if elements is None:
        return None, name, False
    position = position + len(elements) if position < 0 else position
    return (elements[position] if 0 <= position < len(elements) else None), name, False


def unknown(tok: Tokenizer, name: str, written: str) -> tuple[list[Piece], bool]:
    """A variable the script never sets: named (unresolved) and kept as written, for the nodes to set."""
    tok.unresolved.append(name)
    return [(("$" + name) if written == "${" + name + "}" else written, Q)], False


def joined(values: str | list[str] | None) -> str:
    return " ".join(values) if isinstance(values, list) else values or ""


def emit(values: str | list[str], quoted: bool, star: bool) -> tuple[list[Piece], bool]:
    kind = Q if quoted else EXP
    if not isinstance(values, list):
        return [(values, kind)], False
    if not quoted or star:
        return [(" ".join(values), kind)], False
    out: list[Piece] = []
    for number, value in enumerate(values):
        out += [BREAK] if number else []
        out.append((value, Q))
    return out, True


def word_result(tok: Tokenizer, word: str, quoted: bool) -> tuple[list[Piece], bool]:
    """The word of ${x:-word} / ${x:+word}: its own quotes removed; split unless it or the expansion is quoted."""
    pieces = tok.word_pieces(word, quoted=quoted)
    if quoted:
        return [p if p == BREAK else (p[0], Q) for p in pieces], False
    return [(text, EXP) if kind == LIT else (text, kind) for text, kind in pieces], False
