"""A finding of `rollout8 check`: one line that names the field and says what to do."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Level = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    level: Level
    rule: str  # short stable id, e.g. "rollout-mode", "verl-key"
    field: str  # the spec field (dotted) the finding is about
    message: str  # what is wrong and how to fix it

    def line(self) -> str:
        return f"{self.level}: {self.field}: {self.message} [{self.rule}]"

    def to_dict(self) -> dict:
        return asdict(self)
