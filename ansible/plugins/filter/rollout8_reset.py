"""The reset role's account of the deploy root on every node, run on the controller: which nodes removed it, which
never had it, which left it in place (a root rollout8 did not make, or a path reset never removes; the node module
rollout8_deploy_root decides, on the node, what may be removed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REMOVED, ABSENT, LEFT = "removed on ", "not there on ", "LEFT IN PLACE on "


def rollout8_reset_summary(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str], deploy_root: str,
                           result: str = "rollout8_reset_root") -> str:
    """One line: 'deploy root R: removed on a, b; LEFT IN PLACE on c (...)', from each host's registered `result`."""
    done: dict[str, list[str]] = {REMOVED: [], ABSENT: [], LEFT: []}
    for host in hosts:
        outcome = hostvars[host].get(result) or {}
        done[REMOVED if outcome.get("removed") else LEFT if outcome.get("refused") else ABSENT].append(host)
    parts = "; ".join(key + ", ".join(who) for key, who in done.items() if who)
    why = " (not made by rollout8, or a path reset never removes: the lines above say why)" if done[LEFT] else ""
    return f"deploy root {deploy_root}: {parts}{why}"


class FilterModule:
    def filters(self):
        return {"rollout8_reset_summary": rollout8_reset_summary}
