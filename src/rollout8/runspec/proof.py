"""The controller's proofs around a plan, so the Ansible plan role runs one command (`rollout8 plan`):

- `ensure_profile`: the FlashRL profile, computed once (streaming both checkpoints) when the spec's profile file
  is missing; an existing one is never rewritten (`rollout8 check` and the verify below judge it);
- `verify_artifacts`: the full `verify-quant` of the int8 model against the bf16 weights and the profile, every
  layer (`check` samples a few), once per set of artifacts: the report is kept in the plan directory under a key
  made of their checksums in the plan, so a re-run with the same bytes reads one file; a failed run is not kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..errors import CheckFailed
from ..fileutil import atomic_write, sha256_json
from ..quant.checkpoint import require_kind
from ..quant.profile import write_profile
from ..quant.verify import verify
from .runspec import RunSpec

VERIFIED_PARTS = ("bf16", "int8", "profile")


def ensure_profile(spec: RunSpec, progress: Callable[[int, int], None] | None = None) -> Path | None:
    """Write the spec's profile when it is missing (int8 and hybrid runs); the path written, else None."""
    path = spec.local_path("profile") if spec.flashrl else None
    if path is None or path.exists():
        return None
    require_kind(spec.model.bf16, int8=False, flag="model.bf16")
    require_kind(spec.model.int8, int8=True, flag="model.int8")
    write_profile(spec.model.bf16, spec.model.int8, path, progress=progress)
    return path


def verify_report_path(out: Path, sha256: dict[str, str]) -> Path:
    """Where the verify-quant report of these artifacts is kept: keyed by the checksums of every file of them."""
    parts = {k: v for k, v in sha256.items() if k.split("/", 1)[0] in VERIFIED_PARTS}
    return out / f"verify-quant-{sha256_json(parts)[:16]}.json"


def verify_artifacts(spec: RunSpec, sha256: dict[str, str], out: Path,
                     progress: Callable[[int, int], None] | None = None) -> tuple[Path, bool]:
    """(report path, cached): the full verify-quant of the spec's int8 model, or its kept report. Raises CheckFailed
    naming the failing tensors (nothing kept, so the next run verifies again)."""
    report_path = verify_report_path(out, sha256)
    if report_path.is_file():
        return report_path, True
    profile = spec.local_path("profile")
    report = verify(spec.model.bf16, spec.model.int8, profile, progress=progress)
    if not report.passed:
        failed = report.failures
        names = ", ".join(f"{r.name} ({r.message})" for r in failed[:3])
        raise CheckFailed(
            f"verify-quant refuses the artifacts (nothing was copied to any node): {len(failed)} tensor(s) of "
            f"{spec.model.int8} do not match {spec.model.bf16} with {profile}: {names}"
            + (" ..." if len(failed) > 3 else "")
            + ". Re-run `rollout8 profile -m BF16 -q INT8 -o PROFILE` if the profile is stale, or give the int8 twin "
              "of the bf16 model.")
    atomic_write(report_path, json.dumps(report.to_dict(), indent=2) + "\n")
    return report_path, False
