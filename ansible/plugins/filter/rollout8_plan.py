"""The plan role's rules on the controller: whether the head plans the run (deploy.shared_storage: the models are on
the nodes' storage, which a jump-host controller does not mount), and the volumes of the one-off training container
that plans it there. Pure functions of their inputs, tested on dicts (tests/unit/test_plan_filters.py)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

import yaml


def rollout8_spec_shared_storage(spec_path: str) -> bool:
    """The run spec says deploy.shared_storage: true. A spec that cannot be read or parsed says no here: the plan
    (`rollout8 plan`) then refuses it in its own words."""
    try:
        with open(spec_path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return False
    deploy = raw.get("deploy") if isinstance(raw, dict) else None
    return isinstance(deploy, dict) and deploy.get("shared_storage") is True


def rollout8_head_plan_volumes(plan: Mapping[str, Any], work: str, write_profile: bool) -> list[str]:
    """`docker run` arguments (-v SRC:DEST[:ro] ...) of the training container that plans the run on the head:
    its work directory (the spec copied there, the plan it writes) read-write, every model and data path the
    training container mounts read-only, and, when the profile may be written (missing, generated), the profile's
    directory read-write in place of the profile itself (a bind of a missing file makes Docker create a directory
    there)."""
    profile = (plan.get("node_paths") or {}).get("profile")
    volumes = [f"{work}:{work}"]
    for path in plan.get("mounts") or []:
        if write_profile and path == profile:
            continue
        volumes.append(f"{path}:{path}:ro")
    if write_profile and profile:
        parent = posixpath.dirname(profile)
        volumes.append(f"{parent}:{parent}")
    out = []
    for volume in volumes:
        out += ["-v", volume]
    return out


def rollout8_plan_missing_ok(plan: Mapping[str, Any], write_profile: bool) -> list[str]:
    """The shared-storage paths preflight may find missing on a node: the profile when the head will make it."""
    profile = (plan.get("node_paths") or {}).get("profile")
    return [profile] if write_profile and profile else []


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (rollout8_spec_shared_storage, rollout8_head_plan_volumes,
                                        rollout8_plan_missing_ok)}
