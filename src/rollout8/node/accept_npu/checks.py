"""The judgement of each step: facts in (facts.py, gathered on the node by tests/npu), one StepResult out.
Everything here runs without an NPU and is tested on CPU (tests/unit/test_accept_npu.py)."""

from __future__ import annotations

import re
from pathlib import Path

from ..npu_visibility import NOSET
from .facts import (
    HCCL_MASTER,
    HCCL_RANK,
    MIN_SYNC_GBPS,
    EnvFacts,
    HcclPlan,
    ImportProbe,
    NpuSmi,
    SpeedRun,
    SyncTiming,
    parse_npu_smi,
    parse_probes,
)
from .report import FAIL, PASS, SKIP, StepResult, result
from .weights import MAX_LSB, NZ_FORMAT, WeightComparison


# ------------------------------------------------------------------------------------------------ environment
def same_release(found: str | None, pinned: str) -> bool:
    """CANN style: case-insensitive equality (8.2.RC3 == 8.2.rc3)."""
    return found is not None and found.strip().lower() == pinned.strip().lower()


def same_python_release(found: str | None, pinned: str) -> bool:
    """torch/torch_npu style: the pinned release, optionally with a local (+cpu) or post suffix. A dev or rc
    build of the same number is refused: vllm-ascend's requirements would install torch-npu 2.7.1.dev20250724
    over the pinned 2.7.1, and that is what this catches."""
    if found is None:
        return False
    return re.match(rf"^{re.escape(pinned)}(?:\.post\d+)?(?:\+[\w.]+)?$", found.strip()) is not None


def check_environment(facts: EnvFacts, lock) -> StepResult:
    """Versions against the lock (cann.version, pypi torch / torch_npu), devices, compiled ops."""
    checks: list[tuple[bool, str]] = []
    if facts.npu_smi_text is None:
        checks.append((False, f"npu-smi did not run ({facts.errors.get('npu-smi', 'not found')}): is the "
                              f"driver installed and /usr/local/bin/npu-smi mounted into the container?"))
        smi = NpuSmi(None, [])
    else:
        smi = parse_npu_smi(facts.npu_smi_text)
        bad = [f"NPU {i} {name} health {h}" for i, name, h in smi.npus if h.upper() != "OK"]
        checks.append((bool(smi.npus) and not bad,
                       f"npu-smi {smi.version or '?'}: {len(smi.npus)} NPU(s)"
                       + (f", unhealthy: {', '.join(bad)}" if bad else ", all OK" if smi.npus else " listed")))
    pinned_cann = lock.cann.version
    checks.append((same_release(facts.cann_version, pinned_cann),
                   f"CANN {facts.cann_version or 'not found'} (lock {pinned_cann}"
                   + (f", from {facts.cann_source})" if facts.cann_source else ")")))
    checks.append((facts.driver_version is not None,
                   f"driver {facts.driver_version or 'not found (/usr/local/Ascend/driver/version.info)'}"
                   " (not pinned in the lock: must be one CANN " + pinned_cann + " supports)"))
    for pkg, found in (("torch", facts.torch_version), ("torch_npu", facts.torch_npu_version)):
        pinned = lock.pypi.get(pkg)
        if pinned is None:
            continue
        checks.append((same_python_release(found, pinned), f"{pkg} {found or 'not importable'} (lock {pinned})"))
    n = facts.npu_device_count
    listed = len(smi.npus)
    checks.append((bool(n) and (not listed or n <= listed),
                   f"torch_npu sees {n if n is not None else 'no'} NPU(s)"
                   + (f" of {listed} listed" if listed else "")
                   + (f" ({facts.errors['torch_npu']})" if "torch_npu" in facts.errors else "")))
    checks.append((facts.vllm_ascend_c_error is None,
                   "vllm_ascend_C loads" if facts.vllm_ascend_c_error is None else
                   f"vllm_ascend_C does not load ({facts.vllm_ascend_c_error}): rebuild vllm-ascend with "
                   f"COMPILE_CUSTOM_KERNELS=1 and the CANN env sourced"))
    return result("environment", checks)


# ------------------------------------------------------------------------------------------------ loading, reload
def check_reload(comparison: WeightComparison, *, generated_before: list[str], generated_after: list[str],
                 formats: dict | None = None, max_lsb: int = MAX_LSB) -> StepResult:
    """The reload step: generation after the update, and the engine's int8 weights vs the expectation."""
    checks = [(bool(generated_after) and all(t.strip() for t in generated_after),
               f"generated after the update ({len(generated_after)} completions)")]
    fmt = ""
    kinds = sorted({int(f) for f in (formats or {}).values() if f is not None})  # None: not an NPU tensor
    if kinds:
        fmt = f", engine format {'NZ' if kinds == [NZ_FORMAT] else kinds}"
    if comparison.problem:
        checks.append((False, f"int8 weights: {comparison.problem}"))
    elif comparison.missing:
        checks.append((False, f"int8 weights missing in the engine: {', '.join(comparison.missing[:3])}"))
    else:
        worst = comparison.worst_lsb
        bad = sorted(n for n, r in comparison.rows.items() if r[0] > max_lsb)
        share = max((r[1] for r in comparison.rows.values()), default=0.0)
        orient = "[in, out]" if comparison.transposed else "[out, in]"
        checks.append((not bad and bool(comparison.rows),
                       f"{len(comparison.rows)} int8 weights equal verify-quant's expectation within {worst} LSB "
                       f"(max {100 * share:.1f}% entries off; engine keeps them {orient}{fmt})" if not bad else
                       f"{len(bad)} int8 weight(s) off by up to {worst} LSB (allowed {max_lsb}): "
                       f"{', '.join(bad[:3])}: the reload did not land in the engine's layout"
                       f"{fmt} (trap 6: transposed NZ weights)"))
    if generated_before and generated_after and generated_before != generated_after:
        checks.append((True, "text changed after the update (expected when the weights moved)"))
    return result("reload", checks)


def check_loading(start: dict, generated: list[str], int8_dir: str) -> StepResult:
    """The engine came up on the int8 model with the ascend method, FlashRL's hook is on, and text came out."""
    checks = [
        (start.get("served_model") == int8_dir,
         f"FlashRL swapped the model to {start.get('served_model')}" if start.get("served_model") == int8_dir else
         f"engine serves {start.get('served_model')}, not the int8 model {int8_dir}: FlashRL's config was not "
         f"applied (FLASHRL_CONFIG, import flash_rl first)"),
        (start.get("quantization") == "ascend", f"quantization {start.get('quantization')!r} (need 'ascend')"),
        (start.get("qkv_weight_dtype") == "torch.int8", f"qkv weight {start.get('qkv_weight_dtype')}"),
        (bool(start.get("has_flashrl_load_weights")), "FlashRL load_weights hook "
         + ("installed" if start.get("has_flashrl_load_weights") else "missing")),
        (bool(generated) and all(t.strip() for t in generated), f"generated {len(generated)} completion(s)"),
    ]
    return result("loading", checks)


# ------------------------------------------------------------------------------------------------ speed
def speed_table(runs: list[SpeedRun]) -> str:
    lines = [f"{'engine':<8} {'prompts':>7} {'tokens':>8} {'seconds':>8} {'tokens/s':>10}"]
    for r in runs:
        lines.append(f"{r.engine:<8} {r.prompts:>7} {r.tokens:>8} {r.seconds:>8.2f} {r.tokens_per_second:>10.1f}")
    return "\n".join(lines)


def check_speed(int8: SpeedRun | None, bf16: SpeedRun | None) -> StepResult:
    """Informational: both engines must produce tokens; the ratio is reported, not judged (small models and
    short prompts pay the per-token activation quantization without the memory-bandwidth win)."""
    if int8 is None or bf16 is None:
        missing = [name for name, r in (("int8", int8), ("bf16", bf16)) if r is None]
        return StepResult("speed", FAIL, f"no measurement from the {' and '.join(missing)} engine")
    ok = int8.tokens > 0 and bf16.tokens > 0
    ratio = int8.tokens_per_second / bf16.tokens_per_second if bf16.tokens_per_second else 0.0
    summary = (f"int8 {int8.tokens_per_second:.1f} tokens/s vs bf16 {bf16.tokens_per_second:.1f} tokens/s "
               f"(x{ratio:.2f}, same {int8.prompts} prompts)")
    return StepResult("speed", PASS if ok else FAIL, summary if ok else "an engine produced no tokens: " + summary,
                      speed_table([int8, bf16]).splitlines())


# ------------------------------------------------------------------------------------------------ logs
def check_logs(returncode: int, output: str) -> StepResult:
    last = next((line for line in reversed(output.strip().splitlines()) if line.strip()), "(no output)")
    if returncode == 0:
        return StepResult("logs", PASS, f"rollout8 logs: {last}")
    return StepResult("logs", FAIL, f"rollout8 logs exited {returncode}: {last}")


# ------------------------------------------------------------------------------------------------ cann-pairing
def _last_line(output: str) -> str:
    """The output's last non-blank line, stripped ("(no output)" if there is none)."""
    return next((ln.strip() for ln in reversed(output.strip().splitlines()) if ln.strip()), "(no output)")


_UNDEFINED = re.compile(r"(?:(\S+\.so[\w.]*):\s*)?undefined symbol:\s*(\S+)")
_MISSING_LIB = re.compile(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file")
_TORCH_SYMBOL = re.compile(r"_ZN[KN]?(?:5torch|3c10|2at)\d")  # a symbol of torch itself (torch::, c10::, at::)


def classify_import_failure(output: str) -> tuple[str, str]:
    """(kind, detail) of a failed `import torch_npu`: undefined-symbol (a CANN symbol: library, symbol),
    torch-symbol (a symbol of torch itself: torch and torch_npu differ), missing-library, absent, other (the last
    line)."""
    m = _UNDEFINED.search(output)
    if m:
        lib = Path(m.group(1)).name if m.group(1) else "a library"
        kind = "torch-symbol" if _TORCH_SYMBOL.match(m.group(2)) else "undefined-symbol"
        return kind, f"undefined symbol {m.group(2)} in {lib}"
    m = _MISSING_LIB.search(output)
    if m:
        return "missing-library", f"{m.group(1)} not found"
    if re.search(r"No module named '?torch_npu'", output):
        return "absent", "torch_npu is not installed in this interpreter"
    last = _last_line(output)
    return "other", last[-300:]


def check_cann_pairing(probe: ImportProbe, lock) -> StepResult:
    """torch_npu loads against this CANN. An undefined symbol is the pairing failure of Ascend/pytorch #99 (torch_npu
    2.7.1 on CANN 8.3.RC1, in libtbe_adapter.so): the fix is the lock's pair, not a path tweak."""
    pin_cann, pin_npu = lock.cann.version, lock.pypi.get("torch_npu", "?")
    pair = f"the lock's pair is CANN {pin_cann} + torch_npu {pin_npu}"
    found = f"torch_npu {probe.torch_npu_version or '?'} on CANN {probe.cann_version or '(version not found)'}"
    if probe.returncode == 0:
        lock_pair = same_release(probe.cann_version, pin_cann) and same_python_release(probe.torch_npu_version, pin_npu)
        return StepResult("cann-pairing", PASS, f"{found} loads in a fresh process ({pair}"
                          + ("" if lock_pair else "; this is not it: see the environment step") + ")")
    kind, detail = classify_import_failure(probe.output)
    if kind == "undefined-symbol":
        what = (f"{found} does not load ({detail}): this CANN (toolkit or nnal) and this torch_npu are not a working "
                f"pair (torch_npu 2.7.1 on CANN 8.3.RC1 fails so, in nnal's libtbe_adapter.so: Ascend/pytorch #99); "
                f"run the image built from versions.lock.yaml ({pair}), not a CANN upgraded or mounted from the host")
    elif kind == "torch-symbol":
        what = (f"{found} does not load ({detail}): a symbol of torch itself, so torch and torch_npu are not a pair; "
                f"install the lock's torch {lock.pypi.get('torch', '?')} with torch_npu {pin_npu} (the image does)")
    elif kind == "missing-library":
        what = (f"{found} does not load ({detail}): the CANN environment is not sourced in this process; run through "
                f"/usr/local/bin/rollout8-entrypoint or source ascend-toolkit's and nnal/atb's set_env.sh ({pair})")
    elif kind == "absent":
        what = f"{detail}: set ACCEPT_PYTHON to the image's python ({pair})"
    else:
        what = f"{found} does not load (exit {probe.returncode}: {detail}) ({pair})"
    return StepResult("cann-pairing", FAIL, what)


# ------------------------------------------------------------------------------------------------ ray-npu
def _seen(probe: dict) -> str:
    vis = probe.get("visible")
    return (f"is_available {probe.get('available')}, {probe.get('count')} NPU(s), ASCEND_RT_VISIBLE_DEVICES="
            f"{'(unset)' if vis is None else repr(vis)}, {NOSET}={probe.get('noset') or '(unset)'}")


def check_ray_npu(*, returncode: int | None, output: str, skip: str | None = None) -> StepResult:
    """The entrypoint of `ray job submit` and a task with resources={"NPU": 1} both see NPUs, and Ray's workers
    carry the no-set flag (verl chooses devices itself; without the flag Ray renumbers ASCEND_RT_VISIBLE_DEVICES)."""
    if skip:
        return StepResult("ray-npu", SKIP, skip)
    probes = parse_probes(output)
    last = _last_line(output)
    if not probes:
        return StepResult("ray-npu", FAIL, f"the Ray job printed no probe line (ray job submit exited {returncode}: "
                                           f"{last[-300:]}): is Ray's job API reachable at the address given?")
    checks: list[tuple[bool, str]] = []
    entry = probes.get("entrypoint")
    if entry is None:
        checks.append((False, "the entrypoint printed no probe"))
    else:
        ok = bool(entry.get("available")) and (entry.get("count") or 0) >= 1
        checks.append((ok, f"job entrypoint: {_seen(entry)}" if ok else
                       f"the job entrypoint sees no NPU ({_seen(entry)}"
                       + (f"; {entry['error']}" if entry.get("error") else "")
                       + f"): Ray 2.46's job supervisor hides Ascend devices unless {NOSET}=1 (ray #59063); export it "
                         f"before `ray start` on every node (the ray role does) and restart Ray"))
    task = probes.get("task")
    if task is None:
        checks.append((False, "the NPU task printed no probe (the entrypoint failed before it)"))
    elif task.get("error"):
        checks.append((False, f"a Ray task with resources={{'NPU': 1}} did not run ({task['error']}): "
                              f"`ray status` must show NPU resources; start each node with "
                              f"--resources '{{\"NPU\": 8}}'"))
    else:
        sees = bool(task.get("available")) and (task.get("count") or 0) >= 1
        flag = bool(task.get("noset"))  # Ray tests it for truth: any non-empty value (accelerators/npu.py)
        checks.append((sees and flag, f"NPU task: {_seen(task)}" if sees and flag else
                       f"the NPU task {'sees no NPU' if not sees else f'runs without {NOSET}'} ({_seen(task)}): "
                       f"export {NOSET}=1 (and the NPU resource) before `ray start` on every node, then restart Ray"))
    return result("ray-npu", checks)


# ------------------------------------------------------------------------------------------------ weight-sync
POST_LOAD_DOMINANT = 0.5  # share of a sync spent in process_weights_after_loading that names it as the cost


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def check_weight_sync(timing: SyncTiming | None, *, model: str, error: str | None = None,
                      min_gbps: float = MIN_SYNC_GBPS) -> StepResult:
    """One weight sync timed; FAIL below `min_gbps`, naming the part that costs: the post-load transpose/NZ step
    (SkyRL #176's class) or the reload itself (host memory: trap 5)."""
    if timing is None:
        return StepResult("weight-sync", FAIL, f"no sync of {model} was timed: {error or 'the engine did not start'}")
    rate = gbps(timing.bytes, timing.seconds)
    post = timing.post_load_seconds
    share = post / timing.seconds if post is not None and timing.seconds > 0 else None
    size = f"{timing.parameters / 1e9:.1f}B parameters, {timing.bytes / 1e9:.1f} GB bf16"
    post_text = ("post-load step not measured" if share is None else
                 f"post-load transpose/NZ {post:.1f} s ({100 * share:.0f}%)")
    summary = f"one sync of {model} ({size}) in {timing.seconds:.1f} s = {rate:.2f} GB/s, {post_text}"
    details = []
    if timing.parts:
        # the same parts a job's `rollout8: sync` lines carry, so the first NPU numbers land in the same table
        details.append("parts (host-side; the device is synchronized at the sync's ends only): " + ", ".join(
            f"{name} {seconds:.2f} s" for name, seconds in timing.parts.items()))
    if rate >= min_gbps:
        return StepResult("weight-sync", PASS, f"{summary} (needed >= {min_gbps} GB/s)", details)
    if share is not None and share >= POST_LOAD_DOMINANT:
        why = ("vllm-ascend's W8A8_DYNAMIC post-load step (transpose + NZ cast of every int8 weight), which FlashRL "
               "re-runs at every sync, is the cost (SkyRL #176: 140 s per sync for a 32B model on GPUs); every "
               "training step pays it: report this line before planning step times")
    else:
        why = ("the reload itself is slow: it goes through host memory (trap 5); check that patch flash_rl/0002 is "
               "applied and ROLLOUT8_FLASHRL_HOST_RELOAD is unset")
    return StepResult("weight-sync", FAIL, f"{summary}: below {min_gbps} GB/s: {why}", details)


# ------------------------------------------------------------------------------------------------ hccl
ONE_NODE = (f"one node given: to test HCCL between nodes set {HCCL_MASTER}=<first node's cluster IP>:<free port> "
            f"on both nodes, {HCCL_RANK}=0 on the first and 1 on the second, and run `make accept-npu` on both "
            f"within HCCL_CONNECT_TIMEOUT of each other (the peer may run only this step: PYTEST_ARGS='-k hccl')")


def check_hccl(plan: HcclPlan | None, probe: dict | None, *, tensor: str, shape: tuple[int, int],
               dtype_bytes: int = 2, problem: str | None = None) -> StepResult:
    """Judge one rank's HCCL probe: init, a broadcast from rank 0 and an all-reduce of `shape`, each checked
    entry by entry; a failure's HCCL code is mapped to its usual cause (hccl_codes)."""
    from ..hccl_codes import explain, parse_hccl_error

    if problem:
        return StepResult("hccl", FAIL, problem)
    if plan is None:
        return StepResult("hccl", SKIP, ONE_NODE)
    nbytes = shape[0] * shape[1] * dtype_bytes
    what = f"{tensor} {list(shape)}, {nbytes / 1e9:.2f} GB"
    who = f"rank {plan.rank} of {plan.world} via {plan.master}:{plan.port}"
    if probe is None:
        return StepResult("hccl", FAIL, f"{who}: the HCCL probe printed nothing (killed or timed out)")
    if probe.get("error"):
        parsed = parse_hccl_error(probe["error"])
        cause = explain(parsed) if parsed else probe["error"].strip().splitlines()[-1][-300:]
        if parsed is None and probe.get("phase", "init") == "init":
            cause += (f" (no HCCL code: if the other node never joined, run the step there too within "
                      f"HCCL_CONNECT_TIMEOUT, with the same {HCCL_MASTER} and its own {HCCL_RANK})")
        env = ", ".join(f"{k}={v}" for k, v in sorted((probe.get("env") or {}).items())) or "no HCCL_* set"
        return StepResult("hccl", FAIL, f"{who}: {probe.get('phase', 'init')} failed: {cause} ({env})")
    checks: list[tuple[bool, str]] = [(True, f"{who}: communicator up in {probe.get('init_s', 0):.1f} s")]
    for op, label in (("broadcast", "broadcast from rank 0"), ("all_reduce", "all-reduce")):
        r = probe.get(op) or {}
        bad, total = r.get("mismatched", -1), r.get("entries", 0)
        secs = float(r.get("seconds") or 0.0)
        if bad == 0 and total:
            checks.append((True, f"{label} of {what} correct in {secs:.2f} s ({gbps(nbytes, secs):.1f} GB/s)"))
        elif op == "broadcast":
            checks.append((False, f"broadcast of {what} returned wrong data ({bad} of {total} entries): the HCCL "
                                  f"large-tensor broadcast bug that verl's W8A8 rollout on Ascend had to work around "
                                  f"(verl PR #6834); multi-node weight broadcasts of this size would be corrupt: do "
                                  f"not train multi-node on this CANN; report the line"))
        else:
            checks.append((False, f"all-reduce of {what} returned wrong sums ({bad} of {total} entries): HCCL between "
                                  f"these nodes is not trustworthy; report the line with both nodes' plogs"))
    return result("hccl", checks)
