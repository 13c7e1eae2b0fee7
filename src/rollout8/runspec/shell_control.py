"""A launch script's commands and blocks, read without running them: the logical lines split at `;`, `if`/`elif`/
`else`/`fi` and `case ... esac` parsed into their branches, and the tests that choose a branch (`[ ]`, `[[ ]]`,
`test`, `true`, `false`, `!`, `&&`, `||`) evaluated when the script or the given environment decides them.

A test that needs the machine (a file test such as `-f`, a command, `=~`) or a variable nobody set is not decided:
shell_script names it and reads none of its branches. Loops, functions and `{ }` groups are kept whole and named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .shell_expand import LIT, Dynamic, glob_regex, skip_construct, skip_quoted

OPENERS = {"if", "case", "for", "while", "until", "select", "{"}
CLOSERS = {"fi": "if", "esac": "case", "done": "do", "}": "{"}
HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")
ELSE = "else"  # the condition of an else branch
FUNCTION = re.compile(r"\s*(function\s+[\w.:-]+|[\w.:-]+\s*\(\s*\))")


@dataclass
class Node:
    """One command, or a block: `if` (branches: (line, condition text, body)), `case`, or a kept-whole block."""

    kind: str  # "command", "if", "case", "block"
    line: int
    text: str
    branches: list[tuple[int, str, list[Node]]] = field(default_factory=list)  # if: condition; case: patterns
    end: int = 0
    closed: bool = True


# ---------------------------------------------------------------------------------------------- commands
def split_line(text: str) -> list[str]:
    """A logical line's commands: split at `;` (`;;` kept as its own item) outside quotes and expansions."""
    out, start, i = [], 0, 0
    while i < len(text):
        ch = text[i]
        after = skip_construct(text, i)
        if after is not None:
            i = after
        elif ch == "#" and (i == 0 or text[i - 1] in " \t\n;&|("):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif ch == ";":
            out.append(text[start:i])
            if text.startswith(";;", i):
                out.append(";;")
                i += 1
            start = i = i + 1
        else:
            i += 1
    out.append(text[start:])
    return [part.strip() for part in out if part.strip() and not part.strip().startswith("#")]


def commands(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(line, command text) of every command, with `then`/`else`/`do`/`case W in` apart from what follows."""
    out: list[tuple[int, str]] = []
    heredoc = ""
    for number, line in lines:
        if heredoc:  # a here-document's body is data, not commands
            heredoc = "" if line.strip() == heredoc else heredoc
            continue
        match = HEREDOC.search(line)
        heredoc = match.group(1) if match and "((" not in line[:match.start()] else ""
        try:
            parts = split_line(line)
        except Dynamic:
            parts = [line.strip()]
        for part in parts:
            while True:
                match = re.match(r"(then|else|do)\s+(.*)", part, re.DOTALL) or \
                    re.match(r"(case\s+.+?\s+in)\s+(.*)", part, re.DOTALL)
                if not match:
                    break
                out.append((number, match.group(1)))
                part = match.group(2).strip()
            out.append((number, part))
    return out


def first_word(text: str) -> str:
    return text.split(None, 1)[0] if text.split() else ""


# ---------------------------------------------------------------------------------------------- blocks
def parse(items: list[tuple[int, str]]) -> list[Node]:
    nodes, index = [], 0
    while index < len(items):
        node, index = _node(items, index)
        nodes.append(node)
    return nodes


def _node(items: list[tuple[int, str]], index: int) -> tuple[Node, int]:
    number, text = items[index]
    word = first_word(text)
    if word == "if":
        return _if(items, index)
    if word == "case":
        return _case(items, index)
    if word in OPENERS or FUNCTION.match(text):
        end = _block_end(items, index)
        closed = end < len(items)
        return Node("block", number, text, end=items[min(end, len(items) - 1)][0], closed=closed), end + 1
    return Node("command", number, text), index + 1


def _block_end(items: list[tuple[int, str]], index: int) -> int:
    """The index of the command that closes the block opened at index (len(items) if none does)."""
    depth = 0
    for position in range(index, len(items)):
        text = items[position][1]
        words = re.findall(r"[^\s;&|()]+|[{}]", re.sub(r"(^|\s)#.*", "", text))
        depth += sum(w in OPENERS for w in words) - sum(w in CLOSERS for w in words)
        if FUNCTION.match(text) and "{" not in words:
            depth += 1  # `f()` with its `{` on the next line
        if depth <= 0:
            return position
    return len(items)


def _if(items: list[tuple[int, str]], index: int) -> tuple[Node, int]:
    """if COND; then BODY [elif COND; then BODY]... [else BODY] fi; the else branch's condition is ELSE."""
    number, text = items[index]
    node = Node("if", number, text)
    line, condition, body = number, _rest(text), []
    index += 1
    while index < len(items):
        at, part = items[index]
        word = first_word(part)
        if part == "then" and not body:
            index += 1
            continue
        if word in ("elif", "else", "fi"):
            node.branches.append((line, condition, body))
            if word == "fi":
                node.end = at
                return node, index + 1
            line, condition, body = at, _rest(part) if word == "elif" else ELSE, []
            index += 1
            continue
        child, index = _node(items, index)
        body.append(child)
    node.branches.append((line, condition, body))
    node.closed, node.end = False, items[-1][0]
    return node, index


def _rest(text: str) -> str:
    return text.split(None, 1)[1] if len(text.split()) > 1 else ""


def _case(items: list[tuple[int, str]], index: int) -> tuple[Node, int]:
    """case WORD in [(]PATTERN[|PATTERN]) BODY ;; ... esac."""
    number, text = items[index]
    match = re.fullmatch(r"case\s+(.+?)\s+in", text, re.DOTALL)
    node = Node("case", number, match.group(1) if match else text)
    index += 1
    body: list[Node] | None = None
    while index < len(items):
        line, part = items[index]
        if part == "esac":
            node.end = line
            return node, index + 1
        if part == ";;":
            body = None
            index += 1
            continue
        if body is None:
            close = _pattern_end(part)
            if close < 0:
                raise Dynamic(f"a case item without `)`: {part}")
            body = []
            node.branches.append((line, part[:close].lstrip("(").strip(), body))
            part = part[close + 1:].strip()
            if not part:
                index += 1
                continue
            if part.endswith("esac") and first_word(part) == "esac":
                node.end = line
                return node, index + 1
            items = items[:index] + [(line, part)] + items[index + 1:]
        child, index = _node(items, index)
        body.append(child)
    node.closed, node.end = False, items[-1][0]
    return node, index


def _pattern_end(text: str) -> int:
    i = 1 if text.startswith("(") else 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
        elif ch == "'":
            i = text.find("'", i + 1) + 1 or len(text)
        elif ch == '"':
            i = skip_quoted(text, i)
        elif ch == ")":
            return i
        else:
            i += 1
    return -1


# ---------------------------------------------------------------------------------------------- tests
NUMERIC = {"-eq": lambda a, b: a == b, "-ne": lambda a, b: a != b, "-lt": lambda a, b: a < b,
           "-le": lambda a, b: a <= b, "-gt": lambda a, b: a > b, "-ge": lambda a, b: a >= b}
FILE_TESTS = {"-a", "-b", "-c", "-d", "-e", "-f", "-g", "-h", "-k", "-p", "-r", "-s", "-t", "-u", "-w", "-x",
              "-G", "-L", "-N", "-O", "-S", "-v", "-o", "-R"}


class Undecided(Exception):
    """What a test depends on that the reader cannot know (its reason)."""


def test_words(words: list[str], globbing: bool) -> bool:
    """The truth of `[ words ]` / `[[ words ]]` (Undecided if it needs the machine)."""
    if words[:1] == ["!"]:
        return not test_words(words[1:], globbing)
    for op in ("-o", "-a") if not globbing else ():
        if op in words[1:-1]:
            at = words.index(op, 1)
            left, right = test_words(words[:at], globbing), test_words(words[at + 1:], globbing)
            return (left or right) if op == "-o" else (left and right)
    if words[:1] == ["("] and words[-1:] == [")"]:
        return test_words(words[1:-1], globbing)
    if len(words) == 0:
        return False
    if len(words) == 1:
        return words[0] != ""
    if len(words) == 2:
        op, value = words
        if op == "-z":
            return value == ""
        if op == "-n":
            return value != ""
        if op in FILE_TESTS:
            raise Undecided(f"the file test {op} {value} (the nodes' files, not this machine's)")
        raise Undecided(f"the test {op} {value}")
    if len(words) == 3:
        left, op, right = words
        if op in ("=", "==", "!="):
            pattern = getattr(right, "pattern", None) or _glob(right)  # a quoted part of a [[ ]] pattern is literal
            same = bool(re.fullmatch(pattern, left, re.DOTALL)) if globbing else left == right
            return same if op != "!=" else not same
        if op in NUMERIC:
            try:
                return NUMERIC[op](int(left), int(right))
            except ValueError:
                raise Undecided(f"{left} {op} {right} on a value that is not an integer") from None
        if op == "=~":
            raise Undecided(f"the regular expression test {left} =~ {right}")
        if op in ("-nt", "-ot", "-ef"):
            raise Undecided(f"the file test {left} {op} {right}")
    raise Undecided(f"the test {' '.join(words)}")


def _glob(pattern: str) -> str:
    return glob_regex([(pattern, LIT)])


def command_truth(words: list[str]) -> bool:
    """The exit status of one command of a condition, as true/false (Undecided unless it is a test)."""
    if words[:1] == ["!"]:
        return not command_truth(words[1:])
    if words in (["true"], [":"]):
        return True
    if words == ["false"]:
        return False
    if words[:1] == ["["] and words[-1:] == ["]"]:
        return test_words(words[1:-1], globbing=False)
    if words[:1] == ["test"]:
        return test_words(words[1:], globbing=False)
    if words[:1] == ["[["] and words[-1:] == ["]]"]:
        return test_words(words[1:-1], globbing=True)
    raise Undecided(f"the command `{' '.join(words)[:80]}`, whose result needs running it")


def and_or(elements: list[list[str]], operators: list[str]) -> bool:
    """`a && b || c` as bash runs it: left to right, each operator deciding whether the next element runs."""
    merged: list[list[str]] = []
    for words in elements:  # `[[ a && b ]]` arrives as `[[ a`, `b ]]`: the same as `[[ a ]] && [[ b ]]`
        if merged and merged[-1][:1] == ["[["] and merged[-1][-1:] != ["]]"]:
            merged[-1] = merged[-1] + ["]]"]
            words = ["[["] + words
        merged.append(words)
    status = command_truth(merged[0])
    for op, words in zip(operators, merged[1:], strict=True):
        if (op == "&&") == status:
            status = command_truth(words)
    return status


def assigned_names(nodes: list[Node]) -> set[str]:
    """Every variable a block's commands may assign (forgotten when the block is not read)."""
    names: set[str] = set()
    for node in nodes:
        names.update(re.findall(r"(?:^|[\s;])(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?"
                                r"([A-Za-z_][A-Za-z0-9_]*)\+?=", node.text))
        names.update(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?=", node.text))
        for _, _, body in node.branches:
            names |= assigned_names(body)
    return names
