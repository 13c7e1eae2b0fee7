"""The cluster probe job: one Ray task per node proving the deployment is in place where rollouts will run.

`rollout8 probe-job --plan <deploy.root>/rollout8-plan.json` is submitted by Ansible as a Ray job (instead of
verl) on the simulated CPU cluster, and can be submitted the same way on NPU nodes before a real run.
The driver (on the head) places one task on every alive node that offers the `NPU` custom resource, with a
hard node-affinity and the node's whole NPU count, so the check runs where verl's rollout workers would. Each
task reports, from inside a Ray worker process:

- env: FLASHRL_CONFIG (and the other FLASHRL_* variables) as the Ray worker sees them. A value exported only in
  the driver does not reach workers (stack-facts trap 2): that is a failure naming the node;
- artifacts: sha256 of the FlashRL YAML, the profile and every model file at their node paths, compared with the
  head's own files (computed by the driver) and with the controller's checksums in the plan;
- activation: a fresh Python process in the worker's environment runs exactly what the patched verl/__init__.py
  runs (`import flash_rl` then `import rollout8.activate`) and the `rollout8: flash_rl activation` line it logs is
  parsed. What this proves on a CPU node: flash_rl imports, it sees FLASHRL_CONFIG at import time, and the config
  and every path in it are absolute and present (else activation refuses it). What it cannot prove without vLLM:
  that FlashRL hooked vLLM's LLM (`vllm_hooked=no-vllm`); that is accepted only when the run's accelerator is cpu;
- cann: the CANN environment (ASCEND_TOOLKIT_HOME, ASCEND_OPP_PATH, the toolkit's LD_LIBRARY_PATH) in the Ray
  worker and in the driver, when the runtime has CANN: a process started by a bare `docker exec` lacks it
  (`rollout8.node.cann_env`);
- npu-visible: the NPUs stay visible in the Ray worker and in the driver, the `ray job submit` entrypoint where
  verl's driver runs: Ray must have been started with RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1, or it hides
  them from the entrypoint and renumbers them in workers (`rollout8.node.npu_visibility`, ray #59063);
- quantization: `rollout8 verify-quant` on the node's copies of the bf16 model, int8 model and profile; the online
  int8 weights must stay within 1 LSB of the checkpoint's.

The driver prints one line per node and check, a final `ROLLOUT8_PROBE_VERDICT {json}` line (what the verify play
and `rollout8 logs` read), writes the same JSON to --json-out if given, and exits 0 only if every node is green.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..errors import CheckFailed
from ..fileutil import sha256_file
from .cann_env import cann_env, judge_cann_env
from .npu_visibility import judge_npu_visibility, npu_visibility

VERDICT_PREFIX = "ROLLOUT8_PROBE_VERDICT "
ACTIVATION_MARKER = "rollout8: flash_rl activation:"
ACTIVATION_SNIPPET = "import flash_rl  # noqa\nimport rollout8.activate  # noqa\n"
MAX_LSB = 1


# ---------------------------------------------------------------------------------------------- node side
def artifact_checksums(paths: dict[str, str]) -> dict[str, str]:
    """sha256 of every file under the given node paths, keyed 'what/relative' ('missing' if absent)."""
    out: dict[str, str] = {}
    for what, raw in sorted(paths.items()):
        path = Path(raw)
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                out[f"{what}/{file.relative_to(path)}"] = sha256_file(file)
        elif path.is_file():
            out[what] = sha256_file(path)
        else:
            out[what] = "missing"
    return out


def parse_activation(stderr: str) -> dict[str, str] | None:
    for line in stderr.splitlines():
        if ACTIVATION_MARKER in line:
            fields = {}
            for token in line.split(ACTIVATION_MARKER, 1)[1].split():
                key, sep, value = token.partition("=")
                if sep and key not in fields:
                    fields[key] = value
            return fields
    return None


def run_activation(python: str) -> dict:
    """What the patched verl/__init__.py does, in a fresh process with this worker's environment."""
    env = dict(os.environ, FLASHRL_LOGGING_LEVEL="DEBUG")
    proc = subprocess.run([python, "-c", ACTIVATION_SNIPPET], env=env, capture_output=True, text=True, timeout=300)
    fields = parse_activation(proc.stderr)
    tail = [line for line in proc.stderr.splitlines() if line.strip()][-5:]
    return {"returncode": proc.returncode, "fields": fields, "tail": tail}


def run_verify_quant(cli: str, bf16: str, int8: str, profile: str) -> dict:
    cmd = [cli, "verify-quant", "-m", bf16, "-q", int8, "-p", profile, "--max-lsb", str(MAX_LSB), "--json", "-"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report = None
    return {"returncode": proc.returncode, "report": report, "command": " ".join(cmd),
            "tail": (proc.stdout + proc.stderr).strip().splitlines()[-5:]}


def node_probe(plan: dict) -> dict:
    """Runs inside a Ray worker on one node."""
    import ray

    node_paths = plan["node_paths"]
    report = {
        "hostname": socket.gethostname(),
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FLASHRL_")},
        "checksums": artifact_checksums({k: v for k, v in node_paths.items() if k != "plan"}),
        "activation": run_activation(sys.executable),
        "cann": cann_env(),
        "npu_visibility": npu_visibility(),
    }
    if plan.get("quantization", "int8") in ("int8", "hybrid") and {"bf16", "int8", "profile"} <= node_paths.keys():
        cli = str(Path(sys.executable).with_name("rollout8"))
        report["verify_quant"] = run_verify_quant(cli, node_paths["bf16"], node_paths["int8"], node_paths["profile"])
    return report


# ---------------------------------------------------------------------------------------------- judgement
def judge_node(report: dict, plan: dict, head_sums: dict[str, str]) -> list[tuple[str, bool, str]]:
    """(check, ok, detail) for one node's report."""
    checks: list[tuple[str, bool, str]] = []
    expected_cfg = plan["node_paths"].get("flashrl")
    seen = report["env"].get("FLASHRL_CONFIG")
    if not plan.get("flashrl", True):
        checks.append(("env", seen is None, "FlashRL off for this run" if seen is None
                       else f"FLASHRL_CONFIG={seen} set although the run is bf16"))
    elif seen is None:
        checks.append(("env", False, "FLASHRL_CONFIG is not in the Ray worker's environment on this node (exported "
                                     "only in the driver?): export it on every node before `ray start`"))
    elif seen != expected_cfg:
        checks.append(("env", False, f"FLASHRL_CONFIG={seen} in the Ray worker, expected {expected_cfg}"))
    else:
        checks.append(("env", True, f"FLASHRL_CONFIG={seen} in the Ray worker"))

    sums = report["checksums"]
    missing = sorted(k for k, v in sums.items() if v == "missing")
    differ = sorted(k for k in set(sums) | set(head_sums) if sums.get(k) != head_sums.get(k))
    planned = plan.get("sha256", {})
    off_plan = sorted(k for k, v in planned.items() if sums.get(k) != v)
    if missing or differ or off_plan:
        bits = []
        if missing:
            bits.append(f"missing: {', '.join(missing)}")
        if differ:
            bits.append(f"differs from the head: {', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''}")
        if off_plan:
            bits.append(f"differs from the controller's checksum: {', '.join(off_plan[:5])}")
        checks.append(("artifacts", False, "; ".join(bits)))
    else:
        checks.append(("artifacts", True, f"{len(sums)} files match the head's sha256"))

    act = report["activation"]
    fields = act.get("fields")
    if fields is None:
        checks.append(("activation", False, f"no activation line (exit {act['returncode']}): "
                                            f"{' | '.join(act.get('tail', []))}"))
    else:
        hooked = fields.get("vllm_hooked")
        cfg_ok = not plan.get("flashrl", True) or fields.get("config") == expected_cfg
        if not cfg_ok or act["returncode"] != 0:
            checks.append(("activation", False, f"import flash_rl; import rollout8.activate: "
                                                f"config={fields.get('config')} exit={act['returncode']}"))
        elif hooked == "yes":
            checks.append(("activation", True, f"flash_rl hooked vLLM (config={fields.get('config')})"))
        elif hooked == "no-vllm" and plan.get("accelerator") == "cpu":
            checks.append(("activation", True, f"flash_rl imported with config={fields.get('config')}; vLLM is not "
                                               "installed on CPU nodes, so the vLLM hook itself is not proven here"))
        else:
            checks.append(("activation", False, f"flash_rl did not hook vLLM (vllm_hooked={hooked})"))

    if "cann" in report:
        checks.append(("cann", *judge_cann_env(report["cann"], plan.get("accelerator", "npu"))))

    if "npu_visibility" in report:
        checks.append(("npu-visible", *judge_npu_visibility(report["npu_visibility"], "the Ray worker holding this "
                                                            "node's NPUs", plan.get("accelerator", "npu"))))

    if "verify_quant" in report:
        vq = report["verify_quant"]
        rep = vq.get("report") or {}
        worst = rep.get("summary", {}).get("max_lsb")
        ok = vq["returncode"] == 0 and bool(rep.get("passed")) and worst is not None and worst <= MAX_LSB
        detail = (f"online int8 within {worst} LSB of the checkpoint" if ok
                  else f"verify-quant exit {vq['returncode']}, max_lsb={worst}: {' | '.join(vq.get('tail', []))}")
        checks.append(("verify-quant", ok, detail))
    return checks


# ---------------------------------------------------------------------------------------------- verdict
def read_verdict(text: str) -> dict | None:
    """The one parser of the probe job's verdict: the last `ROLLOUT8_PROBE_VERDICT {json}` payload of a driver log
    (ok, nodes: {address: {hostname, ok, checks: [{check, ok, detail}]}}), None when the log has none. The verify
    role (`rollout8 probe-job --judge`), the simulated cluster and the tests all read it here."""
    found = None
    for line in text.splitlines():
        if line.startswith(VERDICT_PREFIX):
            try:
                payload = json.loads(line[len(VERDICT_PREFIX):])
            except ValueError:
                continue  # a line cut short by a dying driver is no verdict
            if isinstance(payload, dict) and isinstance(payload.get("nodes"), dict):
                found = payload
    return found


def judge_verdict(verdict: dict | None, expected_nodes: int | None) -> tuple[bool, str]:
    """(green, one line) for a parsed verdict: green only with every expected node reporting and every check ok."""
    if verdict is None:
        return False, "probe job RED: no verdict in the driver log (the job did not get to judge the nodes)"
    nodes = verdict["nodes"]
    red = [v.get("hostname", address) for address, v in nodes.items() if not v.get("ok")]
    short = expected_nodes is not None and len(nodes) != expected_nodes
    if verdict.get("ok") and not red and not short:
        return True, f"probe job GREEN on all {len(nodes)} nodes"
    why = [f"RED on {', '.join(red)}"] if red else []
    if short:
        why.append(f"{len(nodes)} of {expected_nodes} nodes reported")
    if not why:
        why.append("the driver's own checks failed (cann or npu-visible in the entrypoint)")
    return False, "probe job " + "; ".join(why)


# ---------------------------------------------------------------------------------------------- driver
def npu_nodes(ray_module) -> list[dict]:
    return [n for n in ray_module.nodes() if n.get("Alive") and n.get("Resources", {}).get("NPU", 0) > 0]


def run_job(plan: dict, expected_nodes: int | None, timeout: float) -> dict:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=True)
    nodes = npu_nodes(ray)
    if expected_nodes is not None and len(nodes) != expected_nodes:
        raise CheckFailed(f"{len(nodes)} alive nodes offer the NPU resource, expected {expected_nodes}: "
                          f"{', '.join(n['NodeManagerAddress'] for n in nodes) or 'none'}")
    print(f"probe-job: {len(nodes)} nodes: {', '.join(n['NodeManagerAddress'] for n in nodes)}", flush=True)
    head_sums = artifact_checksums({k: v for k, v in plan["node_paths"].items() if k != "plan"})
    probe = ray.remote(node_probe)
    refs = {}
    for node in nodes:
        strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        task = probe.options(num_cpus=0, resources={"NPU": node["Resources"]["NPU"]}, scheduling_strategy=strategy,
                             max_retries=0)
        refs[node["NodeManagerAddress"]] = task.remote(plan)
    deadline = time.monotonic() + timeout
    results: dict[str, dict] = {}
    for address, ref in refs.items():
        remaining = max(1.0, deadline - time.monotonic())
        try:
            results[address] = {"report": ray.get(ref, timeout=remaining)}
        except Exception as exc:  # a node that cannot run the task is a red node, not a crash of the driver
            results[address] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    verdict = {"nodes": {}, "ok": True, "driver_env": {"FLASHRL_CONFIG": os.environ.get("FLASHRL_CONFIG")}}
    driver_seen = cann_env()
    driver_ok, driver_cann = judge_cann_env(driver_seen, plan.get("accelerator", "npu"))
    verdict["driver_cann"] = {"ok": driver_ok, "detail": driver_cann, **driver_seen}
    verdict["ok"] &= driver_ok
    print(f"probe-job: driver cann {'ok  ' if driver_ok else 'FAIL'} {driver_cann}", flush=True)
    seen = npu_visibility()
    accelerator = plan.get("accelerator", "npu")
    visible_ok, visible = judge_npu_visibility(seen, "the driver (the job's entrypoint)", accelerator)
    verdict["driver_npu_visibility"] = {"ok": visible_ok, "detail": visible, **seen}
    verdict["ok"] &= visible_ok
    print(f"probe-job: driver npu-visible {'ok  ' if visible_ok else 'FAIL'} {visible}", flush=True)
    for address, result in results.items():
        if "error" in result:
            checks = [("task", False, result["error"])]
            host = address
        else:
            checks = judge_node(result["report"], plan, head_sums)
            host = result["report"]["hostname"]
        ok = all(c[1] for c in checks)
        verdict["ok"] &= ok
        verdict["nodes"][address] = {"hostname": host, "ok": ok,
                                     "checks": [{"check": c, "ok": o, "detail": d} for c, o, d in checks]}
        for check, good, detail in checks:
            print(f"probe-job: {host} ({address}) {check:<12} {'ok  ' if good else 'FAIL'} {detail}", flush=True)
    return verdict
