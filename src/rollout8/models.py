"""The one base of every pydantic model the product reads: an unknown field is an error, never ignored.

- `StrictModel`: `extra="forbid"` (a misspelled or stray field fails with its dotted path instead of being
  dropped silently) and `allow_inf_nan=False` (a float field given `.nan`, `.inf` or the text "nan" fails with its
  dotted path: NaN passes every range check, `nan < 0` and `nan > 1` both being false), and no integer past what
  64 bits hold (the one number rule: a 30-digit count is refused with its dotted path, not passed on to overflow);
- `FrozenModel`: the same, and immutable (the version lock, the run spec: read once, then only derived from).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

INT64_MAX = 2**63 - 1  # the one number rule: no number the product reads (model field, flag, shape) past 64 bits


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _within_64_bits(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
            raise ValueError(f"{value} is more than 64 bits hold (at most {INT64_MAX})")
        return value


class FrozenModel(StrictModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
