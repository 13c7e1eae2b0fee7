"""The benchmark harness behind `make bench`: every figure is a ratio of two things measured side by side.

Each `bench/bench_<name>.py` defines

    def bench(work_dir: pathlib.Path) -> list[dict]

returning rows `{"name": str, "a_label": str, "a": float, "b_label": str, "b": float, "unit": str}`
(optional: "note": str). The harness gives each module a fresh scratch directory, computes a/b, prints a short
table, and writes the rows with the machine they ran on to a JSON file (default bench/results/latest.json).
A module that fails is reported with its error and makes the exit code 1; the others still run.

    python bench/run.py [--only NAME ...] [--out FILE] [--list] [--quick]

--quick (`make bench-quick`): every part at its smallest size and one repetition (ROLLOUT8_BENCH_QUICK=1, read by
each module), so a bench that no longer runs fails where it is run, not at the next reader of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROW_FIELDS = {"name": str, "a_label": str, "a": (int, float), "b_label": str, "b": (int, float), "unit": str}


# Read by every bench_<name>.py (quick()): the smallest sizes and one repetition, every part still run.
QUICK_ENV = "ROLLOUT8_BENCH_QUICK"


def quick() -> bool:
    return os.environ.get(QUICK_ENV) == "1"


class BenchError(Exception):
    """A benchmark module broke the row contract or could not be loaded."""


def discover(bench_dir: Path) -> dict[str, Path]:
    """name -> file for every bench_<name>.py, in name order."""
    return {p.stem[len("bench_"):]: p for p in sorted(bench_dir.glob("bench_*.py"))}


def select(found: dict[str, Path], only: list[str]) -> dict[str, Path]:
    if not only:
        return found
    wanted = [name[len("bench_"):] if name.startswith("bench_") else name for name in only]
    unknown = [name for name in wanted if name not in found]
    if unknown:
        raise BenchError(f"--only {', '.join(unknown)}: no such benchmark (have: {', '.join(found) or 'none'})")
    return {name: found[name] for name in found if name in wanted}


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(f"rollout8_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "bench", None)):
        raise BenchError(f"{path.name} defines no bench(work_dir) function")
    return module


def check_rows(name: str, rows) -> list[dict]:
    if not isinstance(rows, list):
        raise BenchError(f"bench_{name}.bench() returned {type(rows).__name__}, expected a list of rows")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BenchError(f"bench_{name} row {i}: not a dict")
        for field, kind in ROW_FIELDS.items():
            if field not in row:
                raise BenchError(f"bench_{name} row {i} ({row.get('name', '?')}): missing '{field}'")
            if not isinstance(row[field], kind) or isinstance(row[field], bool):
                raise BenchError(f"bench_{name} row {i} ({row.get('name', '?')}): '{field}' is "
                                 f"{type(row[field]).__name__}")
        row = dict(row)
        row["a"], row["b"] = float(row["a"]), float(row["b"])
        row["ratio"] = row["a"] / row["b"] if row["b"] != 0 and math.isfinite(row["b"]) else None
        row["bench"] = name
        out.append(row)
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict:
    try:
        commit = subprocess.run(["git", "-C", str(BENCH_DIR), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_gib": _ram_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "flash-llm-rl": _version("flash-llm-rl"),
        "commit": commit,
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def table(rows: list[dict]) -> str:
    head = ("benchmark", "a", "b", "a/b")
    lines = [(r["name"], f"{r['a_label']}: {_num(r['a'])} {r['unit']}", f"{r['b_label']}: {_num(r['b'])} {r['unit']}",
              _num(r["ratio"]) + ("x" if r["ratio"] is not None else "")) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*ln) for ln in lines])


def markdown(results: dict) -> str:
    m = results["machine"]
    out = [f"Measured {results['finished']} on {m['cpu']} ({m['cores']} cores, {m['ram_gib']} GiB RAM), "
           f"Python {m['python']}, torch {m['torch']}, flash-llm-rl {m['flash-llm-rl']}, commit {m['commit']}, "
           f"load average {m.get('load_average_1m')} at the start.", "",
           "| benchmark | a | b | a/b |", "|---|---|---|---|"]
    for r in results["rows"]:
        out.append(f"| {r['name']} | {r['a_label']}: {_num(r['a'])} {r['unit']} | {r['b_label']}: {_num(r['b'])} "
                   f"{r['unit']} | {_num(r['ratio'])}{'x' if r['ratio'] is not None else ''} |")
    for name, err in results["errors"].items():
        out.append(f"| {name} | failed: {err.splitlines()[0] if err else ''} | | |")
    notes = dict.fromkeys(f"{r['a_label']} vs {r['b_label']}: {r['note']}" for r in results["rows"] if r.get("note"))
    if notes:
        out += [""] + [f"- {note}" for note in notes]
    return "\n".join(out) + "\n"


def run(bench_dir: Path, only: list[str], out: Path, work_root: Path | None = None) -> tuple[dict, int]:
    selected = select(discover(bench_dir), only)
    if not selected:
        raise BenchError(f"no bench_*.py in {bench_dir}")
    results = {"started": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine_info(),
               "rows": [], "errors": {}, "seconds": {}}
    for name, path in selected.items():
        print(f">> bench_{name}", flush=True)
        start = time.perf_counter()
        try:
            module = load(name, path)
            with tempfile.TemporaryDirectory(prefix=f"bench-{name}-", dir=work_root) as tmp:
                rows = check_rows(name, module.bench(Path(tmp)))
            if not rows:  # a benchmark whose prerequisite is absent prints why and returns no rows
                results.setdefault("skipped", []).append(name)
                print(f"-- bench_{name}: skipped (no rows; its output above says why)", flush=True)
            results["rows"].extend(rows)
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not hide the others
            results["errors"][name] = f"{type(exc).__name__}: {exc}"
            print(f"!! bench_{name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            traceback.print_exc(limit=3)
        results["seconds"][name] = round(time.perf_counter() - start, 2)
    results["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    if results["rows"]:
        print()
        print(table(results["rows"]))
    print(f"\nresults: {out} (markdown: {out.with_suffix('.md')})")
    return results, 1 if results["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this benchmark (bench_NAME.py; repeatable)")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "latest.json", help="results JSON")
    parser.add_argument("--bench-dir", type=Path, default=BENCH_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", type=Path, default=None, help="parent of the scratch directories")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--quick", action="store_true",
                        help="every part at its smallest size, one repetition: proves the bench runs (CI's "
                             "`make bench-quick`), its numbers are not the ones to publish")
    args = parser.parse_args(argv)
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    try:
        if args.list:
            for name, path in discover(args.bench_dir).items():
                print(f"{name}\t{path}")
            return 0
        _, code = run(args.bench_dir, args.only, args.out, args.work_dir)
        return code
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
