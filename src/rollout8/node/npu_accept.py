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

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
STEPS = ("environment", "loading", "reload", "logs", "speed")
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
    lines = [r.line() for r in results]
    passed = sum(r.ok for r in results)
    failed = [r.step for r in results if r.status == FAIL]
    verdict = PASS if results and not failed and passed == len(results) else FAIL
    tail = f" (failed: {', '.join(failed)})" if failed else ""
    lines.append(f"acceptance: {verdict} ({passed}/{len(results)} steps passed){tail}")
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
