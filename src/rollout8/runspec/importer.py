"""`rollout8 import SCRIPT.sh`: a run spec from a verl launch script, and what still differs between the two.

The script is read by shell_script (never run). Its hydra overrides go to the spec's own fields where the spec has
one (model path, data files, nodes, NPUs per node, device, reward function), to nothing where render sets the same
value itself (adv_estimator=grpo, rollout.name=vllm), and to `verl:` otherwise; its exported environment goes to
`env:`, except the variables a spec field or render owns (check_verl.OWNED_ENV): those set the field (the NIC, the
HCCL timeouts and ports, FLASHRL_LMHEAD_FP32) or are reported as not carried. The paths are the script's own, valid
on the nodes: the spec says deploy.shared_storage: true. What the script cannot give (the int8 model and its
profile for a FlashRL run) is a marked placeholder, listed.

`differences` compares what a spec renders with what the script gives verl, key by key and order-insensitive, in
the values hydra reads. What render adds by design and no spec field changes (rollout.mode=sync, TIS for FlashRL,
FLASHRL_*, the Ray runtime env, RAY_EXPERIMENTAL_NOSET_..., the HCCL defaults) is listed apart as rollout8's own and
is not a difference.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from . import verl_keys
from .check_verl import OWNED_ENV
from .render import Rendered, render
from .runspec import NAME_PATTERN, RunSpec, parse_spec
from .shell_script import Dropped, Reading
from .verl_keys import QuotedStr, as_hydra_reads, hydra_value, split_key

PLACEHOLDER = "/TODO-rollout8-import"
# verl keys that are the spec's own fields: key -> (section, field)
FIELD_KEYS = {
    "actor_rollout_ref.model.path": ("model", "bf16"),
    "data.train_files": ("data", "train"),
    "data.val_files": ("data", "val"),
    "custom_reward_function.path": ("data", "reward"),
    "trainer.nnodes": ("cluster", "nnodes"),
    "trainer.n_gpus_per_node": ("cluster", "npus_per_node"),
    "trainer.device": ("cluster", "accelerator"),
}
# environment variables that are the spec's own fields: name -> network field ("nic" for the three NIC names)
FIELD_ENV = {"HCCL_SOCKET_IFNAME": "nic", "GLOO_SOCKET_IFNAME": "nic", "TP_SOCKET_IFNAME": "nic",
             "HCCL_CONNECT_TIMEOUT": "hccl_connect_timeout", "HCCL_EXEC_TIMEOUT": "hccl_exec_timeout",
             "HCCL_BUFFSIZE": "hccl_buffsize", "HCCL_HOST_SOCKET_PORT_RANGE": "hccl_host_socket_port_range",
             "HCCL_NPU_SOCKET_PORT_RANGE": "hccl_npu_socket_port_range"}
PATH_KEYS = {"actor_rollout_ref.model.path", "data.train_files", "data.val_files", "custom_reward_function.path"}
RENDER_ENV = {"FLASHRL_CONFIG": "render, which writes the FlashRL config (flashrl.yaml) from model.int8 and "
                                  "model.profile"}


# ---------------------------------------------------------------------------------------------- hydra values
def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote and text[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def hydra_reads(text: str) -> Any:
    """The value hydra reads from the text after `key=`: quoted strings, lists, mappings, bools, numbers, null."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return QuotedStr(re.sub(r"\\(.)", r"\1", text[1:-1]))
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [hydra_reads(p) for p in _split_top(inner, ",")] if inner else []
    if text.startswith("{") and text.endswith("}"):
        inner = text[1:-1].strip()
        pairs = [_split_top(p, ":") for p in _split_top(inner, ",")] if inner else []
        if all(len(p) >= 2 for p in pairs):
            return {p[0]: hydra_reads(":".join(p[1:])) for p in pairs}
    return as_hydra_reads(text)


def canonical(value: Any) -> str:
    """One spelling per value hydra reads (1, 1.0, true and '1' all differ)."""
    return json.dumps(value, sort_keys=True, default=str)


def parse_override(arg: str) -> tuple[str, str, Any] | None:
    """(op, key, value) of one hydra override argument, or None if it is not one."""
    raw, has_value, text = arg.partition("=")
    op, key = split_key(raw)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
        return None
    if op == "~":
        return op, key, hydra_reads(text) if has_value else None
    return (op, key, hydra_reads(text)) if has_value else None


def script_overrides(reading: Reading) -> dict[str, tuple[str, Any]]:
    """key -> (op, value) of the script's overrides (the last wins, as in hydra)."""
    out: dict[str, tuple[str, Any]] = {}
    for arg in reading.command.args if reading.command else []:
        parsed = parse_override(arg)
        if parsed is not None:
            out[parsed[1]] = (parsed[0], parsed[2])
    return out


def rendered_overrides(rendered: Rendered) -> dict[str, tuple[str, Any]]:
    return {o.key: (o.op, hydra_reads(o.arg().partition("=")[2]) if o.op != "~" else None)
            for o in rendered.overrides}


# ---------------------------------------------------------------------------------------------- differences
@dataclass(frozen=True)
class Difference:
    kind: str  # "override" or "env"
    name: str
    script: str | None  # as written for the script's side (None: not there)
    spec: str | None
    ours: bool = False  # rollout8 sets it by design; no spec field changes it

    def line(self) -> str:
        what = "override" if self.kind == "override" else "env"
        if self.script is None:
            return f"only in the spec: {what} {self.name}={self.spec}"
        if self.spec is None:
            return f"only in the script: {what} {self.name}={self.script}"
        return f"different value: {what} {self.name}: script {self.script}, spec {self.spec}"


def _reads(key: str, side: tuple[str, Any] | None) -> str | None:
    """What verl reads for key from one side's override (None: the key is unknown to verl and not set)."""
    if side is None or side[0] == "~":
        return canonical(verl_keys.default(key)) if verl_keys.key_table().get(key, _MISSING) is not _MISSING \
            else None
    return canonical(side[1])


_MISSING = object()


def _shown(op: str, value: Any) -> str:
    return "(deleted)" if op == "~" else hydra_value(value)


def differences(spec: RunSpec, reading: Reading) -> list[Difference]:
    """Every override and variable where the spec's render and the script disagree, sorted; `ours` marks rollout8's
    own (render adds or fixes it and the spec has no say)."""
    rendered = render(spec)
    user_keys = {split_key(raw)[1] for raw in spec.verl}
    out: list[Difference] = []
    mine, theirs = rendered_overrides(rendered), script_overrides(reading)
    for key in sorted(mine.keys() | theirs.keys()):
        a, b = theirs.get(key), mine.get(key)
        if _reads(key, a) == _reads(key, b):
            continue  # the same value, or one side sets verl's own default
        # render's own addition, or a field's default the script leaves to verl; a path is never rollout8's
        ours = b is not None and key not in user_keys and \
            (key not in FIELD_KEYS or (a is None and key not in PATH_KEYS))
        out.append(Difference("override", (b or a)[0] + key, a and _shown(*a), b and _shown(*b), ours))
    script_env = reading.command.env if reading.command else {}
    for name in sorted(rendered.env.keys() | script_env.keys()):
        a, b = script_env.get(name), rendered.env.get(name)
        if a == b:
            continue
        ours = (b is not None and name not in spec.env and (a is None or name not in FIELD_ENV)) or \
            (b is None and name == "HCCL_IF_IP")
        out.append(Difference("env", name, a, b, ours))
    return out


# ---------------------------------------------------------------------------------------------- import
@dataclass
class Imported:
    raw: dict[str, Any]
    comments: dict[str, str]  # dotted field -> the comment written above it
    not_carried: list[Dropped] = field(default_factory=list)
    placeholders: list[str] = field(default_factory=list)


def _line_of(command: Any, needle: str) -> str:
    """file:line of the physical line of the command that holds needle (the command's first line if none)."""
    try:
        lines = command.file.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    found = next((n + 1 for n in range(command.line - 1, len(lines)) if needle in lines[n]), command.line)
    return f"{command.file}:{found}"


def spec_name(text: str) -> str:
    name = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._") or "imported"
    return name[:63] if re.fullmatch(NAME_PATTERN, name[:63]) else "imported"


def build_spec(reading: Reading, name: str) -> Imported:
    """The run spec (a raw mapping, validated by the caller) that renders what the script gives verl."""
    command = reading.command
    assert command is not None
    where = f"{command.file}:{command.line}"
    overrides = script_overrides(reading)
    imp = Imported({}, {})

    def not_carried(what: str, reason: str, harmless: bool = False) -> None:
        var = what.partition("=")[0]
        file, _, line = command.where.get(var, f"{command.file}:{command.line}").rpartition(":")
        imp.not_carried.append(Dropped(Path(file), int(line), what, reason, harmless))

    def carried(what: str, reason: str) -> None:
        not_carried(what, reason, harmless=True)

    engine = overrides.get("actor_rollout_ref.rollout.name")
    if engine is not None and engine[0] != "~" and engine[1] != "vllm":
        raise SpecError(f"{_line_of(command, 'actor_rollout_ref.rollout.name=')}: actor_rollout_ref.rollout.name="
                        f"{hydra_value(engine[1])}: rollout8 runs vLLM "
                        "(FlashRL patches vLLM), not this engine; import a vLLM launch script")
    for arg in command.args:
        if parse_override(arg) is None:
            not_carried(arg, "not a hydra override (key=value, +key=value, ++key=value, ~key)")
    env = dict(command.env)
    flashrl = any(k.startswith("FLASHRL_") for k in env)
    model: dict[str, Any] = {}
    data: dict[str, Any] = {}
    cluster: dict[str, Any] = {"nnodes": 1, "npus_per_node": 8, "accelerator": "npu"}
    network: dict[str, Any] = {}
    verl: dict[str, Any] = {}
    for key, (op, value) in overrides.items():
        if key not in FIELD_KEYS or op == "~":
            continue
        section, name_ = FIELD_KEYS[key]
        target = {"model": model, "data": data, "cluster": cluster}[section]
        if section == "cluster":
            ok = value in ("npu", "cpu") if name_ == "accelerator" else isinstance(value, int) and value >= 1
            if not ok:
                not_carried(f"{key}={hydra_value(value)}", f"not a value {section}.{name_} takes; set it by hand")
                imp.placeholders.append(f"{section}.{name_}: {key} was {hydra_value(value)} in {where}")
                continue
            target[name_] = value
            continue
        elif not isinstance(value, str) or not value:
            not_carried(f"{key}={hydra_value(value)}", f"{section}.{name_} is one path; set it by hand")
            continue
        target[name_] = str(value)
    if cluster["npus_per_node"] > 8:
        cluster["node_kind"] = "a3"
    for what, section, key in (("bf16", model, "actor_rollout_ref.model.path"), ("train", data, "data.train_files"),
                               ("val", data, "data.val_files")):
        if what not in section:
            section[what] = f"{PLACEHOLDER}/{what}"
            imp.placeholders.append(f"{'model' if section is model else 'data'}.{what}: the script sets no "
                                    f"{key}; give the path on the nodes")
        elif "$" in section[what]:
            imp.placeholders.append(f"{'model' if section is model else 'data'}.{what}: {section[what]} names a "
                                    "variable the script does not set; write the path on the nodes")
    rollout: dict[str, Any] = {"quantization": "int8" if flashrl else "bf16"}
    if flashrl:
        model["int8"] = f"{PLACEHOLDER}/int8-model"
        model["profile"] = f"{PLACEHOLDER}/int8-model/profile.pt"
        if cluster["accelerator"] == "npu":
            model["layout"] = "ascend"  # what vllm-ascend loads at the pin (`rollout8 convert --to ascend`)
        imp.placeholders += ["model.int8: the W8A8 int8 checkpoint on the nodes (the script's FlashRL config "
                             "names it; vllm-ascend loads the ascend layout: `rollout8 convert`, model.layout: "
                             "ascend)", "model.profile: the FlashRL profile (`rollout8 profile`)"]
    # the environment: fields, render's own, or env:
    spec_env: dict[str, str] = {}
    owned: list[str] = []
    for var, value in env.items():
        if var in FIELD_ENV:
            key = FIELD_ENV[var]
            if key == "nic":
                if network.get("nic", value) != value:
                    not_carried(f"{var}={value}", f"another NIC than {network['nic']}: cluster.network.nic names "
                                "one for all three")
                    continue
                network["nic"] = value
            elif key.endswith("range"):
                network[key] = value
            elif value.isdigit():
                network[key] = int(value)
            else:
                not_carried(f"{var}={value}", f"cluster.network.{key} takes a number")
                continue
            carried(f"{var}={value}", f"set by {OWNED_ENV[var]}: carried there")
        elif var == "FLASHRL_LMHEAD_FP32":
            rollout["lmhead_fp32"] = value == "1"
            carried(f"{var}={value}", f"set by {OWNED_ENV[var]}: carried there")
        elif var in OWNED_ENV or var in RENDER_ENV:
            owned.append(var)
        elif any(c.isspace() for c in value):
            not_carried(f"{var}={value}", "holds whitespace, which rollout8.env cannot carry; set it by hand")
        else:
            spec_env[var] = value
    if network:
        cluster["network"] = network
    base = {"name": name, "description": f"imported from {reading.script.name} by rollout8 import",
            "model": model, "rollout": rollout, "cluster": cluster, "data": data,
            "deploy": {"shared_storage": True}}
    # render's own values: what the spec renders with no verl block, for the keys and variables it sets itself
    bare = render(parse_spec(dict(base, env=spec_env), Path.cwd(), "<import>"))
    # the checkpoint defaults depend on the verl block (total_training_steps): the script's own values are carried
    derived = {key: value for key, value in rendered_overrides(bare).items() if key not in bare.derived_from}
    derived_env = render(parse_spec(dict(base), Path.cwd(), "<import>")).env
    for var in owned:  # render's own: noted where it renders the same (or the placeholders stand for it)
        same = derived_env.get(var) == env[var] or var in RENDER_ENV or var == "HCCL_IF_IP"
        not_carried(f"{var}={env[var]}", f"set by {OWNED_ENV.get(var) or RENDER_ENV[var]}; not carried"
                    + (f" (rollout8 sets {derived_env[var]})" if var in derived_env and not same else ""), same)
    for var in list(spec_env):
        if derived_env.get(var) == spec_env[var]:
            spec_env.pop(var)  # render sets the same value itself
    for key, (op, value) in overrides.items():
        if key in FIELD_KEYS and op != "~":
            continue  # in its field, or reported as not carried: never a verl override check would refuse
        if key in derived and derived[key][0] == op and canonical(derived[key][1]) == canonical(value):
            continue  # render sets the same value itself
        if key == "actor_rollout_ref.rollout.name":
            not_carried(f"{key}={hydra_value(value)}", "rollout8 runs vLLM (FlashRL patches vLLM only)")
            continue
        verl[f"{op}{key}"] = value
    imp.raw = dict(base, env=spec_env, verl=verl)
    if not spec_env:
        imp.raw.pop("env")
    return imp


# ---------------------------------------------------------------------------------------------- YAML text
def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:  # PyYAML reads 5e-08 as a string: 5.0e-08
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent if exponent[0] in '+-' else '+' + exponent}"
        return text
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    text = str(value)
    plain = re.fullmatch(r"[A-Za-z0-9_./][A-Za-z0-9_./+-]*", text)
    if plain and as_hydra_reads(text) == text and text.lower() not in ("yes", "no", "on", "off", "y", "n", "~"):
        return text
    return json.dumps(text)


def spec_text(imp: Imported, script: Path) -> str:
    raw = imp.raw
    lines = [f"# Imported by `rollout8 import {script}`; check it with `rollout8 check --no-artifacts`, compare",
             f"# with `rollout8 render SPEC --against {script}`."]
    if imp.placeholders:
        lines.append(f"# TODO: every {PLACEHOLDER}/... path is a placeholder the script could not give.")
    for section in ("name", "description", "model", "rollout", "cluster", "data", "deploy", "env", "verl"):
        if section not in raw:
            continue
        value = raw[section]
        if not isinstance(value, dict):
            lines.append(f"{section}: {_scalar(value)}")
            continue
        lines.append(f"{section}:")
        for key, item in value.items():
            if isinstance(item, dict):
                lines.append(f"  {key}:")
                lines += [f"    {k}: {_scalar(v)}" for k, v in item.items()]
            else:
                todo = "  # TODO: placeholder" if isinstance(item, str) and item.startswith(PLACEHOLDER) else ""
                lines.append(f"  {_scalar(key) if section == 'verl' else key}: {_scalar(item)}{todo}")
    return "\n".join(lines) + "\n"
