"""Filters of the validate role, run on the controller: the closest knob to a misspelled one, and one line per
problem naming the hosts it concerns."""

from __future__ import annotations

import difflib


def rollout8_closest(name: str, names: list[str], prefix: str = "rollout8_") -> str:
    """The entry of `names` closest to `name`, or '' when none is close (difflib's ratio of at least 0.6).

    Compared without the shared `prefix`, which would otherwise make every name look alike."""
    tails = {known.removeprefix(prefix): known for known in names}
    match = difflib.get_close_matches(name.removeprefix(prefix), list(tails), n=1, cutoff=0.6)
    return tails[match[0]] if match else ""


def rollout8_per_host(problems: dict[str, list[str]], hosts: list[str]) -> list[str]:
    """One line per problem (in the order first seen), prefixed with the hosts that have it unless every host of
    `hosts` does (a group_vars/all or -e value): {"a": ["x"], "b": ["x", "y"]} -> ["x", "b: y"] for hosts a, b."""
    seen: dict[str, list[str]] = {}
    for host, found in problems.items():
        for problem in dict.fromkeys(found):
            seen.setdefault(problem, []).append(host)
    return [problem if set(hosts) <= set(who) else f"{', '.join(who)}: {problem}" for problem, who in seen.items()]


class FilterModule:
    def filters(self):
        return {"rollout8_closest": rollout8_closest, "rollout8_per_host": rollout8_per_host}
