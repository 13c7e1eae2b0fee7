"""The NPU acceptance suite's logic that needs no NPU: facts in, PASS/FAIL lines out.

`tests/npu/` (marker `npu`, `make accept-npu`) is what a user runs on the first real node before any training.
Its steps, each one PASS/FAIL line:
  environment  npu-smi lists healthy NPUs; CANN and torch_npu match versions.lock.yaml; the driver version is
               shown; torch_npu sees the NPUs; vllm_ascend_C (vllm-ascend's compiled ops) loads
  loading      the converted int8 model loads in vllm.LLM through FlashRL's patched path and generates text
  reload       one FlashRL weight update from the bf16 model, generation again, and the int8 weights in the
               engine equal what verify-quant's arithmetic (rollout8.quantmath) predicts, within 1 LSB
  logs         `rollout8 logs` on FlashRL's log: verdict green
  speed        tokens/s of the int8 engine and of the bf16 engine on the same prompts, side by side
  cann-pairing torch_npu imports in a fresh process on this CANN (an undefined symbol in libtbe_adapter.so means
               CANN and torch_npu are not a working pair: Ascend/pytorch #99)
  ray-npu      torch.npu.is_available() inside a `ray job submit` entrypoint and inside a Ray task that requests
               `NPU` (Ray 2.46's job supervisor does not set the Ascend no-set flag: ray #59063)
  weight-sync  one FlashRL weight sync of a 7B-shaped model, in seconds and GB/s, with the share spent in
               vllm-ascend's post-load transpose/NZ step that FlashRL re-runs at every sync (SkyRL #176)
  hccl         with two nodes: an HCCL broadcast and all-reduce of a tensor as large as the model's largest
               weight (verl PR #6834's large-tensor broadcast bug); HCCL error codes mapped to their usual cause
               (node/hccl_codes.py). Skipped, with how to give the second node, when only one is given.
Gathering the facts happens on the node (tests/npu); evaluating them happens here, and is tested on CPU.

The weight comparison handles what vllm-ascend's W8A8_DYNAMIC post-load step does to the engine's int8
weights: q/k/v and gate/up fused (vLLM), transposed to [in, out] and cast to the NPU's NZ format (29). The node
side reads each weight back in the ND format (npu_format_cast to 2, then to the host); here the orientation is
detected from the non-square fused weights and applied to all (a square o_proj cannot tell by itself).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .npu_visibility import NOSET

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
STEPS = ("environment", "cann-pairing", "ray-npu", "loading", "reload", "logs", "speed", "weight-sync", "hccl")
MAX_LSB = 1  # FlashRL's fitted up/down factor moves a few entries by one LSB from the checkpoint (stack-facts)

# vLLM's fused parameters of a Qwen2/Llama decoder layer and the HF weights they are made of, in order.
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}
NZ_FORMAT, ND_FORMAT = 29, 2


@dataclass
class StepResult:
    step: str
    status: str  # PASS | FAIL | SKIP
    summary: str
    details: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == PASS

    def line(self) -> str:
        return f"{self.status} {self.step}: {self.summary}"


def result(step: str, checks: list[tuple[bool, str]]) -> StepResult:
    """One step from (ok, message) checks: PASS if all pass; the summary names the failures, else all checks."""
    failed = [msg for ok, msg in checks if not ok]
    if not checks:
        return StepResult(step, FAIL, "nothing was checked")
    if failed:
        return StepResult(step, FAIL, "; ".join(failed), [m for _, m in checks])
    return StepResult(step, PASS, "; ".join(m for _, m in checks), [m for _, m in checks])


def format_report(results: list[StepResult]) -> str:
    """The step lines and one verdict. A skipped step (e.g. hccl with one node) is named, not counted: the
    verdict is PASS when every step that ran passed."""
    lines = [r.line() for r in results]
    passed = sum(r.ok for r in results)
    failed = [r.step for r in results if r.status == FAIL]
    skipped = [r.step for r in results if r.status == SKIP]
    ran = len(results) - len(skipped)
    verdict = PASS if ran and not failed and passed == ran else FAIL
    tail = f" (failed: {', '.join(failed)})" if failed else ""
    skip = f"; skipped: {', '.join(skipped)}" if skipped else ""
    lines.append(f"acceptance: {verdict} ({passed}/{ran} steps passed{skip}){tail}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ environment
@dataclass
class NpuSmi:
    version: str | None
    npus: list[tuple[int, str, str]]  # (id, name, health)


_SMI_VERSION = re.compile(r"Version:\s*([0-9][\w.\-]*)")
_SMI_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+([A-Za-z0-9][\w.\-]*)\s*\|\s*([A-Za-z]+)\s*\|")


def parse_npu_smi(text: str) -> NpuSmi:
    """`npu-smi info`: the tool's version and one (id, name, health) per NPU row (chip rows are skipped)."""
    m = _SMI_VERSION.search(text)
    npus = []
    for line in text.splitlines():
        row = _SMI_NPU_ROW.match(line.strip())
        if row:
            npus.append((int(row.group(1)), row.group(2), row.group(3)))
    return NpuSmi(m.group(1) if m else None, npus)


def read_version_file(text: str) -> str | None:
    """`version=X` / `Version=X` (driver version.info, CANN *_install.info) or version.cfg's `[inner:X]`."""
    m = re.search(r"^\s*version\s*=\s*(\S+)", text, re.IGNORECASE | re.MULTILINE)
    if m:
        return m.group(1).strip("\"'")
    m = re.search(r"running_version\s*=\s*\[[^:\]]*:([^\]]+)\]", text)
    return m.group(1).strip() if m else None


def cann_version_files(root: Path) -> list[Path]:
    """Where the CANN toolkit records its version, most specific first."""
    latest = root / "ascend-toolkit" / "latest"
    return [*sorted(latest.glob("*-linux/ascend_toolkit_install.info")), latest / "ascend_toolkit_install.info",
            latest / "version.cfg", *sorted(latest.glob("*-linux/version.cfg"))]


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


@dataclass
class EnvFacts:
    """What the node reported (gathered by tests/npu/conftest.py); None = could not be found."""

    npu_smi_text: str | None = None
    cann_version: str | None = None
    cann_source: str = ""
    driver_version: str | None = None
    torch_version: str | None = None
    torch_npu_version: str | None = None
    npu_device_count: int | None = None
    vllm_ascend_c_error: str | None = None  # None = loaded
    vllm_ascend_version: str | None = None
    errors: dict[str, str] = field(default_factory=dict)


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


# ------------------------------------------------------------------------------------------------ weights
def expected_fused(hf: dict, num_layers: int) -> dict:
    """HF-named int8 weights [out, in] (e.g. quantmath.apply_profile's output) -> vLLM's fused names, still
    [out, in]: q/k/v and gate/up concatenated along the output dimension in that order."""
    import torch

    out = {}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        for fused, parts in FUSED.items():
            names = [p + part + ".weight" for part in parts]
            if all(n in hf for n in names):
                out[p + fused + ".weight"] = torch.cat([hf[n] for n in names], dim=0)
    return out


def detect_orientation(engine: dict, expected: dict) -> bool:
    """True if the engine keeps its int8 weights transposed ([in, out]), False if [out, in]. Decided on the
    non-square weights; raises ValueError if they disagree or fit neither (a layout this code does not know)."""
    votes = set()
    for name, want in expected.items():
        got = engine.get(name)
        if got is None or want.shape[0] == want.shape[1]:
            continue
        if tuple(got.shape) == tuple(want.shape):
            votes.add(False)
        elif tuple(got.shape) == tuple(want.shape[::-1]):
            votes.add(True)
        else:
            raise ValueError(f"{name}: engine shape {tuple(got.shape)} is neither {tuple(want.shape)} nor its "
                             f"transpose")
    if len(votes) != 1:
        raise ValueError("cannot tell the engine's weight orientation" if not votes else
                         "the engine keeps some int8 weights transposed and others not")
    return votes.pop()


@dataclass
class WeightComparison:
    transposed: bool | None
    rows: dict  # name -> (max LSB, share differing, share saturated)
    missing: list[str]
    problem: str = ""

    @property
    def worst_lsb(self) -> int:
        return max((r[0] for r in self.rows.values()), default=0)

    def ok(self, max_lsb: int = MAX_LSB) -> bool:
        return not self.problem and not self.missing and bool(self.rows) and self.worst_lsb <= max_lsb


def compare_engine_int8(engine: dict, expected: dict) -> WeightComparison:
    """Engine int8 weights (vLLM names, as read back in ND format) vs the expected fused [out, in] weights."""
    from ..quant.quantmath import lsb_stats

    missing = sorted(n for n in expected if n not in engine)
    try:
        transposed = detect_orientation(engine, expected)
    except ValueError as exc:
        return WeightComparison(None, {}, missing, str(exc))
    rows = {}
    for name, want in expected.items():
        got = engine.get(name)
        if got is None:
            continue
        got = got.t() if transposed else got
        if tuple(got.shape) != tuple(want.shape):
            return WeightComparison(transposed, rows, missing, f"{name}: shape {tuple(got.shape)} vs "
                                                               f"{tuple(want.shape)}")
        rows[name] = lsb_stats(got, want)
    return WeightComparison(transposed, rows, missing)


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
@dataclass
class SpeedRun:
    engine: str  # "int8" | "bf16"
    prompts: int
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


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
# Imports torch_npu, loads its ATB op library (where Ascend/pytorch #99 failed: nnal's libtbe_adapter.so, loaded by
# torch_npu/op_plugin/atb/_atb_ops.py) and runs one op on the NPU.
IMPORT_PROBE = (
    "import importlib, json, torch, torch_npu\n"
    "try:\n    importlib.import_module('torch_npu.op_plugin.atb._atb_ops')\n"
    "except ModuleNotFoundError:\n    pass\n"
    "x = (torch.ones(2, device='npu') * 2).sum().item()\n"
    "print(json.dumps({'torch': torch.__version__, 'torch_npu': torch_npu.__version__, 'op': x}))\n")
_TORCH_SYMBOL = re.compile(r"_ZN[KN]?(?:5torch|3c10|2at)\d")  # a symbol of torch itself (torch::, c10::, at::)


@dataclass
class ImportProbe:
    """`python -c IMPORT_PROBE` in a fresh process, and the versions known without importing torch_npu."""

    returncode: int
    output: str  # stdout + stderr
    torch_npu_version: str | None  # the installed distribution's metadata
    cann_version: str | None  # as the environment step found it


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
PROBE_MARK = "ROLLOUT8_NPU_PROBE "


DEFAULT_RAY_JOB_API = "http://127.0.0.1:8265"  # the job API stays on loopback (README: the dashboard has no auth)
NO_RAY = ("no Ray job API answers at {address}: start Ray on this node first (the playbook's runtime and ray "
          "roles, or `ray start --head --resources '{{\"NPU\": 8}}'` with " + NOSET + "=1 exported), or name it "
          "with ROLLOUT8_ACCEPT_RAY_ADDRESS")


def ray_job_address(env: dict) -> str:
    """Where the ray-npu step submits: ROLLOUT8_ACCEPT_RAY_ADDRESS, else RAY_ADDRESS if it is the job API's http
    address (a bare HOST:PORT names the GCS, which `ray job submit` cannot use), else the loopback job API."""
    for key in ("ROLLOUT8_ACCEPT_RAY_ADDRESS", "RAY_ADDRESS"):
        value = env.get(key, "").strip()
        if value.startswith(("http://", "https://")):
            return value
        if value and key == "ROLLOUT8_ACCEPT_RAY_ADDRESS":
            return f"http://{value}"
    return DEFAULT_RAY_JOB_API


def parse_probes(text: str) -> dict[str, dict]:
    """The probe lines a Ray job printed (`ROLLOUT8_NPU_PROBE {json}`, anywhere in a line: Ray prefixes worker
    output), keyed by their `where` (entrypoint, task). A line that does not parse is skipped."""
    import json

    found: dict[str, dict] = {}
    for line in text.splitlines():
        _, mark, rest = line.partition(PROBE_MARK)
        if not mark:
            continue
        try:
            probe = json.loads(rest.strip())
        except ValueError:
            continue
        if isinstance(probe, dict) and "where" in probe:
            found[probe["where"]] = probe
    return found


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
# Below 0.5 GB/s a 7B sync (15 GB of bf16) takes > 30 s. For scale: verl #7060 reports 4-6 s per sync for 7B on
# H100 (~3 GB/s); SkyRL #176's INT8 sync of a 32B model (65 GB) took 140 s (~0.47 GB/s), the case to catch.
MIN_SYNC_GBPS = 0.5
POST_LOAD_DOMINANT = 0.5  # share of a sync spent in process_weights_after_loading that names it as the cost


@dataclass
class SyncTiming:
    seconds: float  # model.load_weights (FlashRL's patched one), the post-load step included
    post_load_seconds: float | None  # inside the quant methods' process_weights_after_loading
    bytes: int  # bf16 bytes handed to load_weights
    parameters: int


def min_sync_gbps(env: dict) -> float:
    """ROLLOUT8_ACCEPT_MIN_SYNC_GBPS, else MIN_SYNC_GBPS; a value that is not a positive number is refused."""
    raw = env.get("ROLLOUT8_ACCEPT_MIN_SYNC_GBPS", "").strip()
    if not raw:
        return MIN_SYNC_GBPS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"ROLLOUT8_ACCEPT_MIN_SYNC_GBPS={raw!r}: give a positive number of GB/s")
    return value


def generated_pair_bytes(shape) -> int:
    """Disk a generated pair of `shape` (quant.testmodels.ModelShape) takes in the work directory: the bf16 model,
    its W8A8 twin (linear weights int8, the rest bf16) and the twin's ascend conversion."""
    h, n = shape.hidden_size, shape.num_hidden_layers
    kv = shape.num_key_value_heads * shape.head_dim
    linear = n * (2 * h * h + 2 * h * kv + 3 * h * shape.intermediate_size)
    total = shape.num_parameters()
    return 2 * total + 2 * (linear + 2 * (total - linear))


def room_problem(free: int, need: int, where) -> str | None:
    """One line when `where` lacks `need` bytes (with 10% to spare), else None."""
    if free >= need * 1.1:
        return None
    return (f"needs ~{need / 1e9:.0f} GB free in {where} for the generated 7B-shaped pair, has {free / 1e9:.0f} GB: "
            f"point ROLLOUT8_ACCEPT_WORK at a larger disk, or give your own pair (ROLLOUT8_ACCEPT_BF16 / _INT8)")


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
    if rate >= min_gbps:
        return StepResult("weight-sync", PASS, f"{summary} (needed >= {min_gbps} GB/s)")
    if share is not None and share >= POST_LOAD_DOMINANT:
        why = ("vllm-ascend's W8A8_DYNAMIC post-load step (transpose + NZ cast of every int8 weight), which FlashRL "
               "re-runs at every sync, is the cost (SkyRL #176: 140 s per sync for a 32B model on GPUs); every "
               "training step pays it: report this line before planning step times")
    else:
        why = ("the reload itself is slow: it goes through host memory (trap 5); check that patch flash_rl/0002 is "
               "applied and ROLLOUT8_FLASHRL_HOST_RELOAD is unset")
    return StepResult("weight-sync", FAIL, f"{summary}: below {min_gbps} GB/s: {why}")


# ------------------------------------------------------------------------------------------------ hccl
HCCL_MASTER, HCCL_RANK, HCCL_WORLD = "ROLLOUT8_ACCEPT_HCCL_MASTER", "ROLLOUT8_ACCEPT_HCCL_RANK", \
    "ROLLOUT8_ACCEPT_HCCL_WORLD"
ONE_NODE = (f"one node given: to test HCCL between nodes set {HCCL_MASTER}=<first node's cluster IP>:<free port> "
            f"on both nodes, {HCCL_RANK}=0 on the first and 1 on the second, and run `make accept-npu` on both "
            f"within HCCL_CONNECT_TIMEOUT of each other (the peer may run only this step: PYTEST_ARGS='-k hccl')")


@dataclass(frozen=True)
class HcclPlan:
    master: str
    port: int
    rank: int
    world: int


def hccl_plan(env: dict) -> tuple[HcclPlan | None, str | None]:
    """The two-node plan from the environment: (plan, None), (None, None) with one node, or (None, problem)."""
    master = env.get(HCCL_MASTER, "").strip()
    if not master:
        return None, None
    host, _, port = master.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None, f"{HCCL_MASTER}={master!r}: give HOST:PORT (the first node's cluster IP and a free port)"
    rank, world = env.get(HCCL_RANK, "").strip(), env.get(HCCL_WORLD, "2").strip()
    if not world.isdigit() or int(world) < 2:
        return None, f"{HCCL_WORLD}={world!r}: give the number of nodes taking part (2 or more)"
    if not rank.isdigit() or int(rank) >= int(world):
        return None, f"{HCCL_RANK}={rank!r}: give 0 on the first node and 1 .. {int(world) - 1} on the others"
    return HcclPlan(host.strip("[]"), int(port), int(rank), int(world)), None


def largest_weight(config: dict) -> tuple[str, tuple[int, int]]:
    """The largest single weight of a dense decoder from its config.json: embeddings (or lm_head), an MLP
    projection, or the attention's q/o projection."""
    h, v = int(config["hidden_size"]), int(config["vocab_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or h // heads)
    candidates = [("model.embed_tokens.weight", (v, h)),
                  ("model.layers.0.mlp.gate_proj.weight", (int(config["intermediate_size"]), h)),
                  ("model.layers.0.self_attn.q_proj.weight", (heads * head_dim, h))]
    return max(candidates, key=lambda c: c[1][0] * c[1][1])


def check_hccl(plan: HcclPlan | None, probe: dict | None, *, tensor: str, shape: tuple[int, int],
               dtype_bytes: int = 2, problem: str | None = None) -> StepResult:
    """Judge one rank's HCCL probe: init, a broadcast from rank 0 and an all-reduce of `shape`, each checked
    entry by entry; a failure's HCCL code is mapped to its usual cause (hccl_codes)."""
    from .hccl_codes import explain, parse_hccl_error

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


# ------------------------------------------------------------------------------------------------ without NPU
NEEDS_NPU = ("the NPU acceptance suite needs an Ascend NPU node (driver, CANN {cann}, torch_npu, vllm-ascend): "
             "{why}. Run it on the first real node before any training: `make accept-npu`")


def npu_absent_reason(*, dev: Path = Path("/dev"), which=None, find_spec=None) -> str | None:
    """Why this machine cannot run the suite (None when it can): no /dev/davinci*, no npu-smi, no torch_npu
    or no vllm_ascend. Cheap: imports nothing heavy."""
    import importlib.util
    import shutil

    which = which or shutil.which
    find_spec = find_spec or importlib.util.find_spec
    if not (dev / "davinci_manager").exists() and not any(dev.glob("davinci[0-9]*")):
        return f"no Ascend device nodes ({dev}/davinci*)"
    if which("npu-smi") is None:
        return "npu-smi is not on PATH"
    for module in ("torch_npu", "vllm_ascend"):
        if find_spec(module) is None:
            return f"python module {module} is not installed"
    return None


def main() -> int:
    """`python -m rollout8.npu_accept`: exit 0 on an NPU node, else print why not (plainly) and exit 3."""
    from .cann_env import cann_env, judge_cann_env

    seen = cann_env()
    cann_ok, cann_line = judge_cann_env(seen, "npu")
    why = npu_absent_reason()
    if seen["installed"] or why is None:  # a machine with neither CANN nor an NPU hears only the plain reason
        print(f"accept-npu: {'' if cann_ok else 'FAIL '}{cann_line}", file=sys.stderr)
    if why is None:
        return 0 if cann_ok else 1
    try:
        from ..lock import load_lock

        cann = load_lock().cann.version
    except Exception:  # noqa: BLE001 - the message stays useful without the lock
        cann = "as pinned"
    print("accept-npu: " + NEEDS_NPU.format(cann=cann, why=why), file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
