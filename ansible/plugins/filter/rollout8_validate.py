"""The validate role's rules, run on the controller before any node is touched: every role's contract read once,
every rollout8 variable of every host against it (a name that is no knob, with the closest knob; Ansible's own
check of types and allowed values; what an argument spec cannot say: a number's range, a list given as a string),
then the rules across hosts (addresses, ports, one interface name per NIC, uid:gid). And the plan role's one rule
that reads the inventory: the data NIC named twice, differently.

Each rule returns its refusals, one line each, naming the hosts it concerns unless it concerns every host (a
group_vars/all or -e value); the tasks only assert that the list is empty. `hostvars` is Ansible's (a mapping of
host name to that host's variables: inventory, -e, facts; no role defaults) or, in the tests, a dict of dicts.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

# What each argument-spec type means, in a refusal.
TYPE_MEANINGS = {"bool": "true or false", "int": "an integer", "float": "a number", "list": "a list",
                 "dict": "a mapping", "str": "a string"}
# Ansible's type error, as its argument-spec validator words it (ansible.module_utils.common.parameters)
MISTYPED = re.compile(r"^argument '([^']+)' is of type .* unable to convert to ([a-z]+)")
NUMBER = re.compile(r"^[0-9]+$")
# One interface name, as `ip -br link` prints it before any "@": Linux's IFNAMSIZ is 16 with the NUL.
NIC = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
UID_GID = re.compile(r"^[0-9]+:[0-9]+$")
# The knobs the rules across hosts read, besides the ports.
CLUSTER_KNOBS = ("rollout8_node_address", "rollout8_cluster_nic", "rollout8_container_user")


def rollout8_closest(name: str, names: list[str], prefix: str = "rollout8_") -> str:
    """The entry of `names` closest to `name`, or '' when none is close (difflib's ratio of at least 0.6).

    Compared without the shared `prefix`, which would otherwise make every name look alike."""
    tails = {known.removeprefix(prefix): known for known in names}
    match = difflib.get_close_matches(name.removeprefix(prefix), list(tails), n=1, cutoff=0.6)
    return tails[match[0]] if match else ""


def rollout8_per_host(problems: Mapping[str, list[str]], hosts: list[str]) -> list[str]:
    """One line per problem (in the order first seen), prefixed with the hosts that have it unless every host of
    `hosts` does (a group_vars/all or -e value): {"a": ["x"], "b": ["x", "y"]} -> ["x", "b: y"] for hosts a, b."""
    seen: dict[str, list[str]] = {}
    for host, found in problems.items():
        for problem in dict.fromkeys(found):
            seen.setdefault(problem, []).append(host)
    return [problem if set(hosts) <= set(who) else f"{', '.join(who)}: {problem}" for problem, who in seen.items()]


def rollout8_contract(roles_dir: str, roles: list[str], computed_facts: Mapping[str, str]) -> dict:
    """Every role's contract: `options`, the options of all the entry points of each role's meta/argument_specs.yml
    (a knob belongs to one role), and `computed`, each name a role's vars/main.yml or a play sets (known names, but
    no knobs) with where it is computed."""
    options: dict[str, dict] = {}
    computed = dict(computed_facts)
    for role in roles:
        root = Path(roles_dir) / role
        specs = yaml.safe_load((root / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        for entry in specs.values():
            options.update((entry or {}).get("options") or {})
        derived = root / "vars" / "main.yml"
        if derived.is_file():
            computed.update(dict.fromkeys(yaml.safe_load(derived.read_text()) or {}, f"roles/{role}/vars/main.yml"))
    return {"options": options, "computed": computed}


def rollout8_name_errors(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str], contract: Mapping) -> list[str]:
    """A rollout8_ variable set for a host that is no knob: a computed name (where it is computed), or a typo (the
    closest knob). Facts an earlier run cached (rollout8_node_ip) and the contract fact itself are no input."""
    options, computed = contract["options"], contract["computed"]
    found: dict[str, list[str]] = {}
    for host in hosts:
        values = hostvars[host]
        facts = values.get("ansible_facts") or {}
        found[host] = []
        for key in values:
            if not key.startswith("rollout8_") or key in options or key in facts or key == "rollout8_contract":
                continue
            if key in computed:
                found[host].append(f"{key} is not a knob: the roles compute it ({computed[key]})")
                continue
            close = rollout8_closest(key, list(options))
            found[host].append(f"{key} is not a rollout8 knob ("
                               + (f"did you mean {close}?" if close else
                                  "none is close; the knobs: roles/*/defaults/main.yml") + ")")
    return rollout8_per_host(found, hosts)


def _number(value: Any) -> float:
    """The value as Jinja's float filter reads it (0.0 when it is no number; a huge integer stays exact)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0


# The largest number a knob may hold: a signed 64-bit integer (what the nodes' tools and Ray read a count or a
# size into). A JSON file (-e @vars.json) gives 1e999 (infinity), NaN or a 30-digit integer as easily as a typo.
NUMBER_MAX = 2**63 - 1
# A host name as the inventory gives it: it becomes a file name on the controller (fetched logs, cached facts,
# the head's plan), so letters, digits, '-', '.' and '_' only, and never '..'
HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


MAX_KNOB_VALUES = 10_000


def _expanded_size(value: Any, budget: int = MAX_KNOB_VALUES + 1) -> int:
    """How many values a knob's value holds with its aliases expanded (a shared list counted each time it is
    reached), counted up to budget only: a billion laughs in group_vars stops here, not in a deep copy."""
    count, stack = 0, [value]
    while stack and count < budget:
        item = stack.pop()
        count += 1
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return count


def number_problem(value: Any, low: float, high: float | None) -> str | None:
    """Why a number knob's value breaks the one number rule (finite, within [low, high], never past 64 bits), or
    None. A bool is no number (YAML's `yes` for a count)."""
    if isinstance(value, bool):
        return "is not a number (a boolean)"
    number = _number(value)
    if number != number or number in (float("inf"), float("-inf")):
        return "is not a finite number"
    if number < low or (high is not None and number > high):
        return f"is out of range ({low}" + (f"-{high}" if high is not None else " or more") + ")"
    if number > NUMBER_MAX:
        return "is out of range (more than 64 bits hold: at most 2^63-1)"
    return None


def one_line(text: str) -> str:
    """A refusal on one line: a value's newline or other control character is shown escaped, never printed."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def rollout8_host_name_errors(hosts: list[str]) -> list[str]:
    """Inventory host names that are not names (shell metacharacters, a path, '..'): each becomes a path."""
    bad = [h for h in hosts if not HOST_NAME.match(str(h)) or ".." in str(h)]
    if not bad:
        return []
    return [f"inventory host name {json.dumps(str(h))} is not a host name (letters, digits, '-', '.' and '_'; "
            "it becomes a file name on the controller): name the host so and put its address in ansible_host"
            for h in bad]


def knob_errors(values: Mapping[str, Any], options: Mapping[str, dict], ports: list[str],
                positive: list[str]) -> list[str]:
    """One host's knob errors: Ansible's argument-spec check (types, allowed values) of every knob the host sets,
    its type errors rewritten as one short line each (the variable, its value, what it must be); then, for the knobs
    whose type is right, what a spec cannot say: a list given as a string (Ansible's list type splits "a,b", the
    roles would read the string), a number that breaks the one number rule (number_problem: finite, never past 64
    bits; ports 1-65535, `positive` knobs 1 or more, every other number 0 or more)."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    given = {key: values[key] for key in options if key in values}
    huge = [key for key, value in given.items() if _expanded_size(value) > MAX_KNOB_VALUES]
    if huge:  # YAML aliases in group_vars expand when the value is copied: judge nothing of it
        return [f"{key} holds more than {MAX_KNOB_VALUES} values once its YAML aliases are expanded: no knob is "
                "that large; write the value out" for key in huge]
    # (the validator reads the spec and works on a copy of the values: the contract is shared by every host unchanged)
    result = ArgumentSpecValidator(dict(options)).validate(given, validate_role_argument_spec=True)
    errors, mistyped = [], set()
    for message in dict.fromkeys(result.error_messages):
        match = MISTYPED.search(message)
        if not match:
            errors.append(message)
            continue
        key, kind = match.groups()
        mistyped.add(key)
        errors.append(f"{key}={json.dumps(str(given.get(key)))} is not {TYPE_MEANINGS.get(kind, 'a ' + kind)}")
    for key, value in given.items():
        kind = options[key].get("type")
        if key in mistyped:
            continue
        if kind == "list" and isinstance(value, str):  # Ansible splits "a,b"
            errors.append(f"{key}={json.dumps(value)} is not a list (YAML [a, b]; with -e, JSON: -e "
                          f"'{{\"{key}\": [...]}}')")
        elif kind in ("int", "float"):
            low, high = (1, 65535) if key in ports else (1, None) if key in positive else (0, None)
            problem = number_problem(value, low, high)
            if problem:
                errors.append(f"{key}={json.dumps(value) if isinstance(value, bool) else value} {problem}")
    return [one_line(e) for e in errors]


def rollout8_knob_errors(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str], contract: Mapping,
                         ports: list[str], positive: list[str]) -> list[str]:
    """knob_errors of every host, one line per problem naming its hosts (none when every host has it)."""
    return rollout8_per_host({host: knob_errors(hostvars[host], contract["options"], ports, positive)
                              for host in hosts}, hosts)


def _text(values: Mapping[str, Any], key: str, default: Any = "") -> str:
    """A variable as Jinja's `| string | trim` gives it: the host's value, else `default`."""
    return str(values[key] if key in values else default).strip()


def rollout8_cluster_errors(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str], contract: Mapping,
                            ports: list[str]) -> list[str]:
    """The rules across hosts, each host's value or the knob's default: per host, its Ray ports each their own
    number and outside the worker port range (min not above max), one NIC name, uid:gid; across hosts, no address
    given to two nodes, no machine listed twice (ansible_host and port), one rollout8_ray_port."""
    options = contract["options"]
    per_host: dict[str, list[str]] = {}
    by_address: dict[str, list[str]] = {}
    by_target: dict[str, list[str]] = {}
    by_ray_port: dict[str, list[str]] = {}
    for host in hosts:
        values = hostvars[host]
        v = {key: _text(values, key, options.get(key, {}).get("default", "")) for key in (*CLUSTER_KNOBS, *ports)}
        errors = per_host[host] = []
        if v["rollout8_node_address"]:
            by_address.setdefault(v["rollout8_node_address"], []).append(host)
        target = f"{values.get('ansible_host', host)} port {values.get('ansible_port', 'default')}"
        by_target.setdefault(target, []).append(host)
        by_ray_port.setdefault(v["rollout8_ray_port"], []).append(host)
        low, high = v["rollout8_ray_min_worker_port"], v["rollout8_ray_max_worker_port"]
        workers = (int(low), int(high)) if NUMBER.match(low) and NUMBER.match(high) else None
        if workers and workers[0] > workers[1]:
            errors.append(f"rollout8_ray_min_worker_port={workers[0]} is above rollout8_ray_max_worker_port="
                          f"{workers[1]}")
        first_with: dict[str, str] = {}
        for key in ports:
            if not NUMBER.match(v[key]) or "worker_port" in key:
                continue
            if v[key] in first_with:
                errors.append(f"{key}={v[key]} is {first_with[v[key]]} too (each Ray port needs its own number)")
            first_with.setdefault(v[key], key)
            if workers and workers[0] <= int(v[key]) <= workers[1]:
                errors.append(f"{key}={v[key]} is in the Ray worker port range {workers[0]}-{workers[1]} "
                              "(rollout8_ray_min_worker_port-rollout8_ray_max_worker_port: move one or the other)")
        nic = v["rollout8_cluster_nic"]
        if nic and (not NIC.match(nic) or nic in (".", "..")):
            errors.append(f"rollout8_cluster_nic={json.dumps(nic)} is not one interface name (one NIC, as "
                          '`ip -br link` names it before any "@": up to 15 letters, digits, ".", "_", "-")')
        user = v["rollout8_container_user"]
        if user and not UID_GID.match(user):
            errors.append(f"rollout8_container_user={json.dumps(user)} is not uid:gid (two numbers, as `id -u` and "
                          "`id -g` print them; leave it empty for the login user)")
    out = rollout8_per_host(per_host, hosts)
    out += [f"{' and '.join(who)} have the same rollout8_node_address {address} (each node needs its own)"
            for address, who in by_address.items() if len(who) > 1]
    out += [f"{' and '.join(who)} are one machine (ansible_host {target}; list each node once)"
            for target, who in by_target.items() if len(who) > 1]
    if len(by_ray_port) > 1:
        spread = "; ".join(f"{port} on {', '.join(who)}" for port, who in by_ray_port.items())
        out.append(f"rollout8_ray_port differs between hosts ({spread}; a worker joins the head at its own value: "
                   "set one for the cluster, in group_vars)")
    return out


def rollout8_nic_conflicts(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str], spec_nic: str) -> list[str]:
    """The hosts whose rollout8_cluster_nic names another NIC than the run spec's cluster.network.nic."""
    out = []
    for host in hosts:
        nic = _text(hostvars[host], "rollout8_cluster_nic")
        if spec_nic and nic and nic != spec_nic:
            out.append(f"rollout8_cluster_nic={nic} on {host}")
    return out


def rollout8_nic_unnamed(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str]) -> list[str]:
    """The hosts for which the inventory names no data NIC: neither rollout8_cluster_nic nor rollout8_node_address.
    None: the inventory names one for every node (`rollout8 plan --nic-in-inventory`)."""
    return [host for host in hosts
            if not _text(hostvars[host], "rollout8_cluster_nic") and not _text(hostvars[host], "rollout8_node_address")]


def rollout8_container_ids_spread(hostvars: Mapping[str, Mapping[str, Any]], hosts: list[str]) -> str:
    """The uid:gid the training container runs as on each node (rollout8_container_user, else the login user's
    recorded by the facts play: rollout8_node_login_ids) when the nodes do not agree, one line naming each id and its
    nodes; empty when they do. verl's ranks write one checkpoint directory on cluster.shared_dir: a directory one
    node's uid made is another uid's to write into, and the first save fails."""
    by_ids: dict[str, list[str]] = {}
    from_user = set()
    for host in hosts:
        user = _text(hostvars[host], "rollout8_container_user")
        ids = user or _text(hostvars[host], "rollout8_node_login_ids")
        if not ids:  # a node whose facts were never gathered (outside --limit, not in the cache): nothing to compare
            continue
        if user:
            from_user.add(host)
        by_ids.setdefault(ids, []).append(host)
    if len(by_ids) < 2:
        return ""
    spread = "; ".join(f"{ids} on {', '.join(who)}" for ids, who in by_ids.items())
    compared = [host for who in by_ids.values() for host in who]
    source = ("rollout8_container_user" if from_user == set(compared) else
              "the login user's ids" if not from_user else "rollout8_container_user on some, the login user's ids "
              "on the others")
    common = max(by_ids.items(), key=lambda item: len(item[1]))[0]
    return (f"the training container would run as different uid:gid on different nodes ({spread}; from {source}): "
            "verl's ranks write one checkpoint directory on cluster.shared_dir, and a directory one uid made is not "
            f"another's to write into. Set rollout8_container_user: \"{common}\" for the cluster in group_vars (a "
            "uid:gid that can write cluster.shared_dir from every node), or give the login user one uid and gid on "
            "every node. Nothing was changed.")


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (rollout8_closest, rollout8_per_host, rollout8_contract, rollout8_name_errors,
                                        rollout8_knob_errors, rollout8_cluster_errors, rollout8_nic_conflicts,
                                        rollout8_nic_unnamed, rollout8_container_ids_spread,
                                        rollout8_host_name_errors)}
