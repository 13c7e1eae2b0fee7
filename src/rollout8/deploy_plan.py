"""The deployment plan: what Ansible copies where, the node environment and the Ray job, from one run spec.

`rollout8 plan RUN.yaml -o DIR` runs on the controller (Ansible's artifacts play calls it after `rollout8 check`)
and writes, into DIR:
- `flashrl.yaml`: the FlashRL config with node paths (from `rollout8 render` when that command is available,
  else from `rollout8.flashrl_config`);
- `rollout8-plan.json`: the plan. Its fields:
  `node_paths` (what -> absolute node path: bf16, int8, profile, train, val, flashrl, plan), `copies` (local source
  -> node destination, file or directory, the list the artifacts role copies), `sha256` ('what/relative file' ->
  sha256 of the controller's copy, checked again on every node by the smoke job), `env` (exported on every node
  before `ray start`), `entrypoints` (smoke: the cluster smoke job; verl: the rendered verl command, when
  render produced one), `job_id` (a stable Ray submission id: the same plan gives the same id, so a re-run does
  not launch a finished job twice).

The same inputs always give byte-identical files, so Ansible sees no change on a re-run. Checksums are cached in
DIR/.sha256-cache.json by (path, size, mtime) so a re-run does not re-read large models.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
from pathlib import Path

from .errors import SpecError

PLAN_FILE = "rollout8-plan.json"
FLASHRL_FILE = "flashrl.yaml"


def _sha256(path: Path, cache: dict) -> str:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    if key not in cache:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(4 * 1024 * 1024):
                digest.update(block)
        cache[key] = digest.hexdigest()
    return cache[key]


def _checksums(what: str, local: Path, cache: dict) -> dict[str, str]:
    if local.is_dir():
        files = sorted(p for p in local.rglob("*") if p.is_file())
        return {f"{what}/{p.relative_to(local)}": _sha256(p, cache) for p in files}
    return {what: _sha256(local, cache)}


def node_env(spec, node_paths: dict[str, str]) -> dict[str, str]:
    """The environment every node exports before `ray start` (node-specific HCCL_IF_IP is added by Ansible)."""
    env = {
        "VLLM_USE_V1": "1",
        "HF_HUB_OFFLINE": "1",
        "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1",
        "HCCL_CONNECT_TIMEOUT": str(spec.cluster.network.hccl_connect_timeout),
    }
    net = spec.cluster.network
    if net.nic:
        for name in ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            env[name] = net.nic
    for name, value in (("HCCL_EXEC_TIMEOUT", net.hccl_exec_timeout), ("HCCL_BUFFSIZE", net.hccl_buffsize),
                        ("HCCL_HOST_SOCKET_PORT_RANGE", net.hccl_host_socket_port_range),
                        ("HCCL_NPU_SOCKET_PORT_RANGE", net.hccl_npu_socket_port_range)):
        if value is not None:
            env[name] = str(value)
    if spec.cluster.accelerator == "npu":
        env["PYTORCH_NPU_ALLOC_CONF"] = "expandable_segments:True"
    if spec.flashrl:
        env["FLASHRL_CONFIG"] = node_paths["flashrl"]
        env["FLASHRL_LOGGING_LEVEL"] = "DEBUG"
        env["FLASHRL_LMHEAD_FP32"] = "1" if spec.rollout.lmhead_fp32 else "0"
    env.update(spec.env)
    return dict(sorted(env.items()))


def _rendered(spec_path: Path, out: Path) -> dict | None:
    """Use `rollout8 render` when it is available: its FlashRL YAML, env and verl command win."""
    try:
        from . import render  # noqa: F401  (owned by the run-spec tier; optional here)
    except ImportError:
        return None
    import subprocess
    import sys

    target = out / "render"
    proc = subprocess.run([sys.executable, "-m", "rollout8", "render", str(spec_path), "-o", str(target)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SpecError(f"rollout8 render {spec_path} failed: {(proc.stderr or proc.stdout).strip()}")
    manifest = target / "render.json"
    return json.loads(manifest.read_text()) if manifest.is_file() else None


def build_plan(spec_path: Path, out: Path, cli: str) -> dict:
    from .flashrl_config import config_for_spec, dump_config
    from .runspec import load_spec

    spec = load_spec(spec_path)
    out.mkdir(parents=True, exist_ok=True)
    cache_file = out / ".sha256-cache.json"
    cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}

    root = spec.deploy_root
    node_paths = {what: spec.node_path(what) for what in spec.artifacts()}
    node_paths["plan"] = f"{root}/{PLAN_FILE}"
    copies, sums = [], {}
    for what in spec.artifacts():
        local = spec.local_path(what)
        if local is None or not local.exists():
            raise SpecError(f"{what}: {local} does not exist on the controller (field "
                            f"{'model.' + what if what in ('bf16', 'int8', 'profile') else 'data.' + what})")
        if not spec.deploy.shared_storage:
            copies.append({"what": what, "src": str(local.resolve()), "dest": node_paths[what],
                           "kind": "dir" if local.is_dir() else "file"})
        sums.update(_checksums(what, local, cache))

    rendered = _rendered(spec_path, out)
    flashrl_text = None
    if spec.flashrl:
        node_paths["flashrl"] = spec.node_path("flashrl")
        rendered_yaml = out / "render" / FLASHRL_FILE
        flashrl_text = rendered_yaml.read_text() if rendered and rendered_yaml.is_file() else \
            dump_config(config_for_spec(spec, node_paths=True))
        (out / FLASHRL_FILE).write_text(flashrl_text)
        copies.append({"what": "flashrl", "src": str((out / FLASHRL_FILE).resolve()), "dest": node_paths["flashrl"],
                       "kind": "file"})
        sums["flashrl"] = hashlib.sha256(flashrl_text.encode()).hexdigest()

    if rendered and isinstance(rendered.get("env"), dict):  # render's env is the contract; ours is the fallback
        env = dict(sorted((k, str(v)) for k, v in rendered["env"].items()))
    else:
        env = node_env(spec, node_paths)
    entrypoints = {"smoke": " ".join([shlex.quote(cli), "smoke-job", "--plan", shlex.quote(node_paths["plan"]),
                                      "--nodes", str(spec.cluster.nnodes)])}
    if rendered and rendered.get("command"):
        command = rendered["command"]
        entrypoints["verl"] = command if isinstance(command, str) else shlex.join(command)

    plan = {
        "schema": 1,
        "name": spec.name,
        "accelerator": spec.cluster.accelerator,
        "nnodes": spec.cluster.nnodes,
        "npus_per_node": spec.cluster.npus_per_node,
        "quantization": spec.rollout.quantization,
        "flashrl": spec.flashrl,
        "deploy_root": root,
        "node_paths": dict(sorted(node_paths.items())),
        "copies": copies,
        "sha256": dict(sorted(sums.items())),
        "env": env,
        "entrypoints": entrypoints,
    }
    # The job's identity: what runs and on which bytes (not where the controller keeps its copies).
    identity_fields = {k: v for k, v in plan.items() if k != "copies"}
    identity = hashlib.sha256(json.dumps(identity_fields, sort_keys=True).encode()).hexdigest()[:12]
    plan["job_id"] = f"rollout8-{spec.name}-{identity}"
    text = json.dumps(plan, indent=2, sort_keys=True) + "\n"
    plan_file = out / PLAN_FILE
    if not plan_file.is_file() or plan_file.read_text() != text:
        plan_file.write_text(text)
    cache_file.write_text(json.dumps(cache, sort_keys=True))
    return plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the run spec (configs/runs/*.yaml)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="directory for the plan and FlashRL YAML")
    parser.add_argument("--node-cli", default=os.environ.get("ROLLOUT8_NODE_CLI", "rollout8"),
                        help="the rollout8 command on the nodes (used in the smoke job's entrypoint)")


def run(args: argparse.Namespace) -> int:
    plan = build_plan(args.spec, args.output, args.node_cli)
    print(json.dumps({"plan": str(args.output / PLAN_FILE), "job_id": plan["job_id"],
                      "copies": len(plan["copies"]), "files": len(plan["sha256"])}))
    return 0
