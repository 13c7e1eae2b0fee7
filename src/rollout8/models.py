"""The one base of every pydantic model the product reads: an unknown field is an error, never ignored.

- `StrictModel`: `extra="forbid"` (a misspelled or stray field fails with its dotted path instead of being
  dropped silently) and `allow_inf_nan=False` (a float field given `.nan`, `.inf` or the text "nan" fails with its
  dotted path: NaN passes every range check, `nan < 0` and `nan > 1` both being false);
- `FrozenModel`: the same, and immutable (the version lock, the run spec: read once, then only derived from).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class FrozenModel(StrictModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
