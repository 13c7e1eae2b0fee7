"""What changed between two versions of a run spec, and whether the run's checkpoints resume under the change
(issue 28: a re-run while a job of the run is running names the changed keys and the choices).

The specs are compared as written, key by key (a nested section is its dotted keys, `verl:` entries as verl's
dotted overrides, `env:` one key per variable); paths are compared as the strings they are, relative ones too (the
older version is kept on the head as the text it was). Whether a key resumes is runspec.resumes_under's rule, the
one the checkpoint directory's key follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import verl_keys
from .runspec import resumes_under

MISSING = object()


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any

    @property
    def resumes(self) -> bool:
        return resumes_under(self.key)

    def describe(self) -> str:
        if self.old is MISSING:
            return f"{self.key} added ({self.new!r})"
        if self.new is MISSING:
            return f"{self.key} removed (was {self.old!r})"
        return f"{self.key} {self.old!r} -> {self.new!r}"


def flatten(spec: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; `env:` keys are leaves below it, and `verl:` is its dotted overrides as
    the spec reads them (verl_keys.flatten: nested sections, operators, mappings that are values)."""
    if not isinstance(spec, dict):
        return {prefix: spec} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in spec.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if path == "verl" and isinstance(value, dict):
            out.update({f"verl.{k}": v for k, v in verl_keys.flatten(value).items()})
        elif path == "env" and isinstance(value, dict):
            out.update({f"env.{k}": v for k, v in value.items()})
        elif isinstance(value, dict):
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def diff(old: Any, new: Any) -> list[Change]:
    a, b = flatten(old), flatten(new)
    return [Change(k, a.get(k, MISSING), b.get(k, MISSING)) for k in sorted(a.keys() | b.keys())
            if a.get(k, MISSING) != b.get(k, MISSING) and k != "description"]


def summary(changes: list[Change]) -> str:
    """One line: the changed keys, then whether the run's checkpoints resume under them."""
    if not changes:
        return "no key changed"
    keys = ", ".join(c.describe() for c in changes)
    blocking = [c.key for c in changes if not c.resumes]
    if blocking:
        return (f"{keys}; {', '.join(blocking)} cannot be resumed under: the new version starts from step 0 in a "
                "checkpoint directory of its own")
    return f"{keys}; the run's checkpoints resume under {'it' if len(changes) == 1 else 'them'}"
