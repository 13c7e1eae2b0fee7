"""docker/Dockerfile as the tests read it: stages of steps, continuations joined, comments dropped.

Shared by tests/unit/test_dockerfile_cache.py (which build steps a lock change invalidates) and
tests/unit/test_python_lock.py (how the Dockerfile installs from the hashed Python lock).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Step:
    stage: str
    index: int  # position in its stage
    keyword: str
    text: str
    line: int


@dataclass
class Stage:
    name: str
    base: str  # the FROM text
    steps: list[Step] = field(default_factory=list)


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, KEYWORD, rest) with continuations joined and comments dropped."""
    out, buf, start = [], "", 0
    for no, raw in enumerate(text.splitlines(), 1):
        if not buf and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if buf and raw.lstrip().startswith("#"):
            continue  # a comment line inside a continued instruction
        if not buf:
            start = no
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        buf += raw
        keyword, _, rest = buf.strip().partition(" ")
        out.append((start, keyword.upper(), rest.strip()))
        buf = ""
    return out


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, keyword, rest in instructions(text):
        if keyword == "FROM":
            words = rest.split()
            name = words[words.index("AS") + 1] if "AS" in words else f"stage{len(stages)}"
            stages.append(Stage(name, words[0]))
        elif not stages:
            if keyword == "ARG":
                name, _, default = rest.partition("=")
                global_args[name] = default
        else:
            stage = stages[-1]
            stage.steps.append(Step(stage.name, len(stage.steps), keyword, rest, line))
    return global_args, stages
