"""`rollout8 verify-quant`: does a FlashRL profile turn the bf16 weights into the int8 checkpoint?

For every profile entry it applies what FlashRL does at a weight sync (`quantmath.apply_entry`) to the bf16
weight and compares with the int8 checkpoint: for the int8 linears the largest difference in LSB, the share of
entries that differ and the share that saturate (-128/127); for the norms the largest relative difference.
Entries the profile lacks (an int8 linear FlashRL would not requantize) or has in excess fail too.
Streaming: one tensor pair in memory at a time. Exit 0 when every row passes, 1 otherwise.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import ModelError
from ..fileutil import special_kind
from . import quantmath
from .checkpoint import Checkpoint
from .layout import open_quantized

DEFAULT_MAX_LSB = 1
NORM_RTOL = 1e-3  # norms pass through float16 in FlashRL's profile; the relative rounding is ~5e-4 at most


@dataclass
class Row:
    name: str
    kind: str  # "int8" | "norm" | "missing" | "extra"
    ok: bool
    max_lsb: int | None = None
    mismatch_share: float | None = None
    saturation_share: float | None = None
    max_rel_err: float | None = None
    message: str = ""

    @property
    def layer(self) -> int | None:
        m = re.search(r"\.layers\.(\d+)\.", self.name)
        return int(m.group(1)) if m else None


@dataclass
class Report:
    bf16: str
    int8: str
    profile: str
    max_lsb_allowed: int
    rows: list[Row] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.ok]

    def worst_lsb(self) -> int:
        return max((r.max_lsb for r in self.rows if r.max_lsb is not None), default=0)

    def to_dict(self) -> dict:
        int8_rows = [r for r in self.rows if r.kind == "int8"]
        return {
            "passed": self.passed,
            "bf16": self.bf16,
            "int8": self.int8,
            "profile": self.profile,
            "max_lsb_allowed": self.max_lsb_allowed,
            "summary": {
                "rows": len(self.rows),
                "failed": len(self.failures),
                "max_lsb": self.worst_lsb(),
                "max_saturation_share": max((r.saturation_share or 0.0 for r in int8_rows), default=0.0),
                "failed_names": [r.name for r in self.failures],
            },
            "rows": [{**asdict(r), "layer": r.layer} for r in self.rows],
        }


def load_profile(path: str | Path) -> dict:
    """A FlashRL int8 profile, {name: {input_scale, output_scale, type}}, or ModelError naming the file and, for a
    malformed entry, the entry and field: a scale is a float tensor or a number, a type a torch dtype (a string
    where a scale should be would fail deep in the quantizer)."""
    import torch

    p = Path(path)
    if kind := special_kind(p):
        raise ModelError(f"{p}: {kind}, not a profile file: name the file itself")
    if not p.is_file():
        raise ModelError(f"{p}: profile file does not exist (make one with `rollout8 profile`)")
    try:
        profile = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling problem is a bad file
        raise ModelError(f"{p}: not a readable FlashRL profile ({type(exc).__name__}: {exc})") from exc
    if not isinstance(profile, dict) or not all(isinstance(v, dict) and {"input_scale", "output_scale", "type"}
                                                <= set(v) for v in profile.values()):
        raise ModelError(f"{p}: not a FlashRL profile ({{name: {{input_scale, output_scale, type}}}}); make it with "
                         "`rollout8 profile`")
    for name, entry in profile.items():
        if not isinstance(entry["type"], torch.dtype):
            raise ModelError(f"{p}: entry {str(name)[:80]!r}: type is {type(entry['type']).__name__}, not a torch "
                             "dtype; make the profile again with `rollout8 profile`")
        for key in ("input_scale", "output_scale"):
            value = entry[key]
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number and not (torch.is_tensor(value) and value.is_floating_point()):
                raise ModelError(f"{p}: entry {str(name)[:80]!r}: {key} is {type(value).__name__}, not a float "
                                 "tensor or a number; make the profile again with `rollout8 profile`")
    return profile


def verify(bf16_dir: str | Path, int8_dir: str | Path, profile_path: str | Path,
           max_lsb: int = DEFAULT_MAX_LSB, progress=None, sample: int | None = None) -> Report:
    """Compare FlashRL's online quantization of the bf16 weights (with the profile) against the int8 checkpoint.

    sample: check only this many int8 entries, spread over the model (seconds on any size: `rollout8 check`
    uses it to refuse a profile of another checkpoint); the coverage check is then left out."""
    import torch

    profile = load_profile(profile_path)
    bf16 = Checkpoint(bf16_dir)
    qmodel = open_quantized(int8_dir)
    int8 = qmodel.checkpoint
    report = Report(str(bf16_dir), str(int8_dir), str(profile_path), max_lsb)
    covered = set()
    names = list(profile)
    if sample is not None:
        int8_names = [n for n in names if profile[n]["type"] == torch.int8]
        step = max(1, len(int8_names) // max(sample, 1))
        names = int8_names[::step][:sample]
    for k, name in enumerate(names):
        entry = profile[name]
        if name not in bf16 or name not in int8:
            where = bf16.dir if name not in bf16 else int8.dir
            report.rows.append(Row(name, "extra", False, message=f"profile entry has no tensor in {where}"))
            continue
        weight, target = bf16.get(name), int8.get(name)
        if weight.shape != target.shape:
            report.rows.append(Row(name, "int8" if entry["type"] == torch.int8 else "norm", False,
                                   message=f"shape {tuple(weight.shape)} (bf16) vs {tuple(target.shape)} (int8)"))
            continue
        try:
            online = quantmath.apply_entry(weight, entry)
        except RuntimeError as exc:  # scales that do not broadcast against the weight
            report.rows.append(Row(name, "int8", False, message=f"profile scales do not fit the weight: {exc}"))
            continue
        if entry["type"] == torch.int8:
            covered.add(name[: -len(".weight")])
            if target.dtype != torch.int8:
                report.rows.append(Row(name, "int8", False, message=f"int8 checkpoint stores {target.dtype}"))
                continue
            lsb, mismatch, saturated = quantmath.lsb_stats(online, target)
            ok = lsb <= max_lsb
            report.rows.append(Row(name, "int8", ok, max_lsb=lsb, mismatch_share=mismatch,
                                   saturation_share=saturated,
                                   message="" if ok else f"{lsb} LSB > {max_lsb}"))
        else:
            ref = target.float()
            rel = ((online.float() - ref).abs() / ref.abs().clamp(min=1e-12)).max().item()
            ok = rel <= NORM_RTOL
            report.rows.append(Row(name, "norm", ok, max_rel_err=rel,
                                   message="" if ok else f"relative error {rel:.3g} > {NORM_RTOL}"))
        del weight, target, online
        if progress:
            progress(k + 1, len(names))
    for prefix in qmodel.linears if sample is None else ():
        if prefix not in covered and prefix + ".weight" not in profile:
            report.rows.append(Row(prefix + ".weight", "missing", False,
                                   message="int8 linear not in the profile: FlashRL would not requantize it"))
    return report


def format_table(report: Report) -> str:
    lines = [f"{'tensor':<52} {'kind':<7} {'max LSB':>7} {'differ':>7} {'satur.':>7} {'rel.err':>9}  status"]
    for r in report.rows:
        def pct(x):
            return f"{100 * x:6.2f}%" if x is not None else f"{'-':>7}"
        lines.append(f"{r.name:<52} {r.kind:<7} {r.max_lsb if r.max_lsb is not None else '-':>7} "
                     f"{pct(r.mismatch_share)} {pct(r.saturation_share)} "
                     f"{f'{r.max_rel_err:.2e}' if r.max_rel_err is not None else '-':>9}  "
                     f"{'ok' if r.ok else 'FAIL ' + r.message}")
    s = report.to_dict()["summary"]
    lines.append(f"{s['rows']} tensors, {s['failed']} failed; max error {s['max_lsb']} LSB "
                 f"(allowed {report.max_lsb_allowed}); max saturation {100 * s['max_saturation_share']:.2f}%")
    return "\n".join(lines)
