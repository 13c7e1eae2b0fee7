"""Bash's arithmetic `$(( ))` on 64-bit integers, evaluated by a small parser (never eval()).

The text arrives with its `$VAR`, `${...}` and nested `$(( ))` already expanded (shell_expand does that first, as
bash does); names without `$` are read here from the shell's variables, and a variable's value that is itself an
expression is evaluated in turn, as bash does. What bash would guess and rollout8 does not: an unset variable
(bash reads 0) and a division by zero raise Dynamic, naming them.

Operators, by bash's precedence: `id++ id--`, `++id --id`, unary `- + ! ~` (tighter than `**`, as in bash:
-2**2 is 4), `**` (right), `* / %`, `+ -`, `<< >>`, `< <= > >=`, `== !=`, `&`, `^`, `|`, `&&`, `||`, `?:`,
`= *= /= %= += -= <<= >>= &= ^= |=`, `,`; numbers in decimal, `0x` hex, leading-0 octal and `BASE#digits`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

TOKEN = re.compile(r"\s*(?:(?P<num>\d+#[0-9A-Za-z@_]+|0[xX][0-9A-Fa-f]+|\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                   r"|(?P<op>\*\*=|<<=|>>=|\*\*|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[*/%+\-&^|]=|[-+*/%<>=!~&^|?:(),]))")
BINARY = {  # operator -> (precedence, right-associative)
    ",": (1, False), "||": (4, False), "&&": (5, False), "|": (6, False), "^": (7, False), "&": (8, False),
    "==": (9, False), "!=": (9, False), "<": (10, False), "<=": (10, False), ">": (10, False), ">=": (10, False),
    "<<": (11, False), ">>": (11, False), "+": (12, False), "-": (12, False), "*": (13, False), "/": (13, False),
    "%": (13, False), "**": (14, True),
}
ASSIGN = {"=", "*=", "/=", "%=", "+=", "-=", "<<=", ">>=", "&=", "^=", "|="}
TERNARY, ASSIGNMENT = 3, 2


def wrap(value: int) -> int:
    """Bash's intmax_t: 64-bit two's complement."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


class ArithError(Exception):
    """Why the expression cannot be evaluated statically (shell_expand turns it into Dynamic)."""


def number(text: str) -> int:
    try:
        if "#" in text:
            base_text, digits = text.split("#", 1)
            base = int(base_text)
            alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_"
            if not 2 <= base <= 64:
                raise ArithError(f"invalid arithmetic base {text}")
            table = alphabet if base > 36 else alphabet[:36]
            value = 0
            for ch in digits if base > 36 else digits.lower():
                digit = table.index(ch)
                if digit >= base:
                    raise ValueError
                value = value * base + digit
            return wrap(value)
        if text[:2] in ("0x", "0X"):
            return wrap(int(text, 16))
        return wrap(int(text, 8) if len(text) > 1 and text[0] == "0" else int(text))
    except ValueError:
        raise ArithError(f"value too great for base: {text}") from None


class Arith:
    """One expression: `get(name)` reads a variable (None: unset), `put(name, text)` assigns one."""

    def __init__(self, text: str, get: Callable[[str], str | None], put: Callable[[str, str], None],
                 depth: int = 0) -> None:
        self.get, self.put, self.depth = get, put, depth
        self.tokens: list[tuple[str, str]] = []
        position, text = 0, text.rstrip()
        while position < len(text):
            match = TOKEN.match(text, position)
            if not match or match.end() == position:
                raise ArithError(f"arithmetic syntax error near {text[position:].strip()!r}")
            kind = match.lastgroup or "op"
            self.tokens.append((kind, match.group(kind)))
            position = match.end()
        self.i = 0

    def evaluate(self) -> int:
        if not self.tokens:
            return 0
        value = self.expression(0)
        if self.i < len(self.tokens):
            raise ArithError(f"arithmetic syntax error near {self.tokens[self.i][1]!r}")
        return value

    # ------------------------------------------------------------------------------------------ helpers
    def peek(self) -> tuple[str, str]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "")

    def take(self, op: str) -> None:
        if self.peek() != ("op", op):
            raise ArithError(f"arithmetic syntax error: expected {op!r}")
        self.i += 1

    def variable(self, name: str) -> int:
        text = self.get(name)
        if text is None:
            raise ArithError(f"arithmetic on ${name}, which is not set (bash would read 0)")
        if self.depth > 32:
            raise ArithError(f"arithmetic: ${name} refers to itself")
        return Arith(text, self.get, self.put, self.depth + 1).evaluate()

    # ------------------------------------------------------------------------------------------ grammar
    def expression(self, minimum: int) -> int:
        kind, token = self.peek()
        if kind == "name" and self.tokens[self.i + 1:self.i + 2] and self.tokens[self.i + 1][1] in ASSIGN \
                and minimum <= ASSIGNMENT:
            op = self.tokens[self.i + 1][1]
            self.i += 2
            value = self.expression(ASSIGNMENT)
            if op != "=":
                value = self.binary(op[:-1], self.variable(token), value)
            self.put(token, str(value))
            return value
        left = self.unary()
        while True:
            kind, op = self.peek()
            if kind != "op":
                break
            if op == "?" and minimum <= TERNARY:
                self.i += 1
                yes = self.expression(ASSIGNMENT)
                self.take(":")
                no = self.expression(TERNARY)
                left = yes if left else no
                continue
            if op not in BINARY or BINARY[op][0] < minimum:
                break
            precedence, right = BINARY[op]
            self.i += 1
            right_value = self.expression(precedence if right else precedence + 1)
            left = self.binary(op, left, right_value)
        return left

    def binary(self, op: str, a: int, b: int) -> int:
        if op in ("/", "%"):
            if b == 0:
                raise ArithError("division by 0 in arithmetic")
            quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
            return wrap(quotient if op == "/" else a - quotient * b)
        if op == "**":
            if b < 0:
                raise ArithError("arithmetic: exponent less than 0")
            return wrap(pow(a, b, 1 << 64))
        results = {
            ",": lambda: b, "||": lambda: int(bool(a or b)), "&&": lambda: int(bool(a and b)),
            "|": lambda: a | b, "^": lambda: a ^ b, "&": lambda: a & b, "==": lambda: int(a == b),
            "!=": lambda: int(a != b), "<": lambda: int(a < b), "<=": lambda: int(a <= b), ">": lambda: int(a > b),
            ">=": lambda: int(a >= b), "<<": lambda: a << (b & 63), ">>": lambda: a >> (b & 63),
            "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
        }
        return wrap(results[op]())

    def unary(self) -> int:
        kind, token = self.peek()
        if kind == "op" and token in ("-", "+", "!", "~"):
            self.i += 1
            value = self.unary()
            return {"-": lambda: wrap(-value), "+": lambda: value, "!": lambda: int(not value),
                    "~": lambda: ~value}[token]()
        if kind == "op" and token in ("++", "--"):
            self.i += 1
            name_kind, name = self.peek()
            if name_kind != "name":
                raise ArithError(f"arithmetic: {token} needs a variable")
            self.i += 1
            value = wrap(self.variable(name) + (1 if token == "++" else -1))
            self.put(name, str(value))
            return value
        return self.primary()

    def primary(self) -> int:
        kind, token = self.peek()
        self.i += 1
        if kind == "num":
            return number(token)
        if kind == "name":
            value = self.variable(token)
            if self.peek() in (("op", "++"), ("op", "--")):
                self.put(token, str(wrap(value + (1 if self.peek()[1] == "++" else -1))))
                self.i += 1
            return value
        if (kind, token) == ("op", "("):
            value = self.expression(0)
            self.take(")")
            return value
        raise ArithError(f"arithmetic syntax error near {token or 'the end'!r}")


def evaluate(text: str, get: Callable[[str], str | None], put: Callable[[str, str], None]) -> int:
    """The value of one arithmetic expression (ArithError if it cannot be known without running the script)."""
    return Arith(text, get, put).evaluate()
