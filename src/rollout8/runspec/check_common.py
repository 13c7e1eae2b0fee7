"""What every rule of `rollout8 check` shares: the findings collector and the value verl will see for a key.

The rules themselves live in check_verl (what verl is given) and check_artifacts (the files on this machine);
check runs them in order (run_checks) and is the module other code imports.
"""

from __future__ import annotations

from typing import Any

from ..findings import Finding
from . import verl_keys
from .render import Rendered
from .runspec import RunSpec

ROLLOUT = verl_keys.ROLLOUT_PREFIX


class Collector:
    """The findings of one check run, in the order the rules report them."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def error(self, rule: str, field: str, message: str) -> None:
        self.findings.append(Finding("error", rule, field, message))

    def warning(self, rule: str, field: str, message: str) -> None:
        self.findings.append(Finding("warning", rule, field, message))

    def info(self, rule: str, field: str, message: str) -> None:
        self.findings.append(Finding("info", rule, field, message))


def verl_field(spec: RunSpec, key: str) -> str:
    for raw in spec.verl:
        if verl_keys.split_key(raw)[1] == key:
            return f"verl.{raw}"
    return f"verl.{key}"


def user_sets(spec: RunSpec, key: str) -> bool:
    """The spec's verl block sets key itself (else verl's default, or render's, holds)."""
    return any(verl_keys.split_key(raw)[1] == key for raw in spec.verl)


def effective(rendered: Rendered, key: str) -> Any:
    """The value verl will see: set by the render (spec or derived), deleted, or verl's default at the pin."""
    for override in rendered.overrides:
        if override.key == key:
            return verl_keys.default(key) if override.op == "~" else override.value
    return verl_keys.default(key)


def as_int(c: Collector, rendered: Rendered, key: str) -> int | None:
    value = effective(rendered, key)
    if value is None:
        return None
    try:
        if isinstance(value, bool) or float(value) != int(float(value)):
            raise ValueError
        return int(float(value))
    except (TypeError, ValueError, OverflowError):  # OverflowError: the text "inf" (float() reads it)
        c.error("batch", verl_field(rendered.spec, key), f"{value!r} is not an integer")
        return None


def truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")
