"""Does every line of the hashed Python lock install where the image installs it? (`rollout8 lock --check-wheels`,
part of `make lock-check`.)

The image installs docker/requirements/<layer>-<arch>.txt with `pip install --require-hashes --no-deps` on the
lock's Python (CPython 3.10, Ubuntu 22.04: manylinux up to glibc 2.35, pylock.PLATFORMS) for TARGETARCH. For
every requirement line of every *-aarch64.txt and *-x86_64.txt, the index must hold a file whose sha256 is one of
the line's hashes and that pip takes there: a wheel whose tags pip accepts for CPython 3.10 on linux of that
architecture (cp310-cp310, cp310/cp3x-abi3 with x <= 10, py3/py310-none; manylinux_2_x <= 2_35, manylinux1/2010/
2014, linux_<arch>, or any), whose Requires-Python admits 3.10; or, when the Dockerfile passes no --only-binary, an
sdist: such lines are listed as sdist-only (pip compiles them at image build, on Kunpeng for aarch64). The PyPI
pins of versions.lock.yaml (installed by exact version, no hash in the lock) need a cp310 wheel of that version for
each architecture; on x86_64 torch and the torch-index-only names (pylock.TORCH_INDEX_ONLY) come from the lock's
torch index. Index answers are cached (rollout8.pyindex): only the first run asks.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from . import pylock
from .errors import CheckFailed, IndexUnreachable, LockError
from .lock import ARCHES, Lock, normalize
from .pyindex import PYPI, Getter, IndexFile, JsonIndex, SimpleIndex, label
from .yamlio import read_text

LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
ONLY_BINARY = re.compile(r"--only-binary|PIP_ONLY_BINARY")
JOBS = 8
CACHE = Path(".cache") / "index-json"


# ---------------------------------------------------------------------------------------------- what pip accepts

def platform_ok(tag: str, arch: str, glibc: tuple[int, int]) -> bool:
    if tag in ("any", f"linux_{arch}"):
        return True
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag)
    if match:
        return match.group(3) == arch and (int(match.group(1)), int(match.group(2))) <= glibc
    legacy, _, tag_arch = tag.partition("_")
    return legacy in LEGACY_MANYLINUX and tag_arch == arch and LEGACY_MANYLINUX[legacy] <= glibc


def python_ok(interpreter: str, abi: str, platform_any: bool, py: tuple[int, int]) -> bool:
    """pip's tag order for CPython X.Y: cpXY-{cpXY,abi3,none}-<platform>, cpX{Y..2}-abi3-<platform>,
    py{XY,X,X(Y-1)..X0}-none-<platform>, cpXY-none-any, py*-none-any."""
    match = re.fullmatch(r"(cp|py)(\d)(\d*)", interpreter)
    if not match or int(match.group(2)) != py[0]:
        return False
    kind, minor = match.group(1), int(match.group(3)) if match.group(3) else None
    if kind == "py":
        return abi == "none" and (minor is None or minor <= py[1])
    if minor is None:
        return False
    if platform_any:
        return minor == py[1] and abi == "none"
    if abi == "abi3":
        return 2 <= minor <= py[1]
    return minor == py[1] and abi in (f"cp{py[0]}{py[1]}", "none")


def wheel_tags(filename: str) -> list[tuple[str, str, str]]:
    """The (python, abi, platform) tags of a wheel file name, compressed tag sets expanded; [] if not a wheel."""
    parts = filename[:-4].split("-") if filename.endswith(".whl") else []
    if len(parts) not in (5, 6):
        return []
    pythons, abis, platforms = (p.split(".") for p in parts[-3:])
    return [(p, a, t) for p in pythons for a in abis for t in platforms]


def wheel_installs(filename: str, arch: str, py: tuple[int, int], glibc: tuple[int, int]) -> bool:
    return any(platform_ok(t, arch, glibc) and python_ok(p, a, t == "any", py) for p, a, t in wheel_tags(filename))


def _release(text: str) -> tuple[int, ...] | None:
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(x) for x in match.group().split(".")) if match else None


def python_admits(spec: str | None, py: tuple[int, ...]) -> bool:
    """Whether a Requires-Python specifier admits the interpreter version py (release numbers only; a clause this
    does not understand admits: pip is then the judge)."""
    for clause in (spec or "").split(","):
        match = re.fullmatch(r"\s*(~=|===|==|!=|<=|>=|<|>)\s*(\S+)\s*", clause)
        release = _release(match.group(2).removesuffix(".*")) if match else None
        if release is None:
            continue
        op = match.group(1)
        if match.group(2).endswith(".*"):
            prefix = (py + (0,) * len(release))[: len(release)] == release
            ok = prefix if op == "==" else not prefix if op == "!=" else True
        else:
            n = max(len(release), len(py))
            a, b = py + (0,) * (n - len(py)), release + (0,) * (n - len(release))
            ok = {"==": a == b, "===": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b,
                  "~=": a >= b and a[: len(release) - 1] == b[: len(release) - 1]}[op]
        if not ok:
            return False
    return True


# ---------------------------------------------------------------------------------------------- what to prove

@dataclass(frozen=True)
class Target:
    group: str  # the file it is reported under
    where: str  # file:line, or the lock's key
    name: str
    version: str
    arch: str
    hashes: tuple[str, ...] = ()  # empty: a pin by exact version, any file of that version counts
    index: str = "pypi"  # or "torch"
    sdist_ok: bool = False


@dataclass(frozen=True)
class Verdict:
    status: str  # ok, sdist, fail, unchecked
    why: str = ""


def sdists_allowed(root: Path) -> bool:
    """pip builds an sdist when a line has no wheel for the platform, unless the Dockerfile or a script it runs
    passes --only-binary (or PIP_ONLY_BINARY)."""
    files = [root / "docker" / "Dockerfile", *sorted((root / "docker" / "scripts").glob("*.sh"))]
    return not any(ONLY_BINARY.search(read_text(p, what="build file", error=LockError)) for p in files if p.is_file())


def targets(lock: Lock, lock_file: Path) -> list[Target]:
    root = lock_file.resolve().parent
    folder = pylock.requirements_dir(lock_file)
    if not folder.is_dir():
        raise LockError(f"{folder}: not here (an installed bundle?): run the check in the checkout")
    sdist_ok = sdists_allowed(root)
    out: list[Target] = []
    for arch in ARCHES:
        for path in sorted(folder.glob(f"*-{arch}.txt")):
            rel = str(path.relative_to(root))
            out += [Target(rel, f"{rel}:{e.line}", e.name, e.version, arch, e.hashes, "pypi", sdist_ok)
                    for e in pylock.parse_layer(path)]
    group = f"{lock_file.name} (pypi pins, by exact version)"
    for name, version in lock.pypi.items():
        for arch in ARCHES:
            index = "torch" if arch == "x86_64" and normalize(name) == "torch" else "pypi"
            out.append(Target(group, f"{lock_file.name} pypi.{name} ({arch})", normalize(name), version, arch,
                              index=index))
    for path in sorted(folder.glob("*-aarch64.txt")):  # x86_64 takes these from the torch index at this version
        rel = str(path.relative_to(root))
        out += [Target(group, f"{rel}:{e.line} {e.name} (x86_64, torch index)", e.name, e.version, "x86_64",
                       index="torch") for e in pylock.parse_layer(path) if e.name in pylock.TORCH_INDEX_ONLY]
    return out


def judge(target: Target, files: list[IndexFile] | None, py: tuple[int, int], glibc: tuple[int, int],
          index_label: str) -> Verdict:
    if files is None:
        return Verdict("fail", f"no such version on {index_label}")
    pool = [f for f in files if f.sha256 in target.hashes] if target.hashes else files
    if not pool:
        return Verdict("fail", f"no file with a locked hash ({index_label} has {len(files)}: {_listing(files, py)})")
    wheels = [f for f in pool if wheel_installs(f.filename, target.arch, py, glibc)
              and python_admits(f.requires_python, py)]
    if wheels:
        return Verdict("ok", wheels[0].filename)
    sdists = [f for f in pool if f.kind == "sdist" and python_admits(f.requires_python, py)]
    if sdists and target.sdist_ok:
        return Verdict("sdist", sdists[0].filename)
    what = "files with a locked hash exist" if target.hashes else "files of that version exist"
    where = f"CPython {py[0]}.{py[1]} manylinux (glibc {glibc[0]}.{glibc[1]}) {target.arch}"
    extra = "; sdists do not count: the build passes --only-binary" if sdists else ""
    return Verdict("fail", f"{what} but none installs on {where} (found: {_listing(pool, py)}){extra}")


def _listing(files: list[IndexFile], py: tuple[int, int], most: int = 8) -> str:
    seen: list[str] = []
    for f in files:
        tags = wheel_tags(f.filename)
        text = "-".join(f.filename[:-4].split("-")[-3:]) if tags else f.kind if f.kind == "sdist" else f.filename
        if not python_admits(f.requires_python, py):
            text += f" [requires-python {f.requires_python}]"
        if text not in seen:
            seen.append(text)
    return ", ".join(seen[:most]) + (f", +{len(seen) - most} more" if len(seen) > most else "")


# ---------------------------------------------------------------------------------------------- asking and telling

def index_url(env: Mapping[str, str]) -> tuple[str, str | None]:
    """(the JSON API's base, a note if PIP_INDEX_URL was set but not used): ROLLOUT8_INDEX_URL, else
    PIP_INDEX_URL when it is the simple form <base>/simple, else PyPI."""
    if env.get("ROLLOUT8_INDEX_URL"):
        return env["ROLLOUT8_INDEX_URL"], None
    pip = env.get("PIP_INDEX_URL", "").strip()
    match = re.fullmatch(r"(\S+?)/simple/?", pip)
    if match:
        return match.group(1), None
    note = (f"PIP_INDEX_URL={label(pip)} is not of the form <base>/simple: asking {PYPI} (set ROLLOUT8_INDEX_URL to "
            "the mirror's JSON API base)") if pip else None
    return PYPI, note


def fetch(wanted: list[Target], indexes: Mapping[str, JsonIndex | SimpleIndex], jobs: int,
          say: Callable[[str], None]) -> tuple[dict[tuple[str, str, str], list[IndexFile] | None],
                                               dict[str, IndexUnreachable], int]:
    """Every (index, name, version) the targets need, JOBS at a time: (answers, the indexes that could not be asked
    and why, how many answers came from the index rather than the cache)."""
    keys = sorted({(t.index, t.name, t.version) for t in wanted})
    answers: dict[tuple[str, str, str], list[IndexFile] | None] = {}
    dead: dict[str, IndexUnreachable] = {}
    guard = threading.Lock()
    to_ask = sum(not indexes[i].cache_path(n, v).is_file() for i, n, v in keys)
    if to_ask:
        where = ", ".join(sorted({indexes[i].label for i, n, v in keys}))
        say(f"lock --check-wheels: asking {where} for {to_ask} of {len(keys)} releases ({len(keys) - to_ask} cached "
            f"in {CACHE}), {jobs} at a time")

    def one(key: tuple[str, str, str]) -> tuple[list[IndexFile] | None, bool | None]:
        """(files, whether the cache answered), or (None, None): not asked, the index is unreachable."""
        if key[0] in dead:
            return None, None
        try:
            return indexes[key[0]].files(key[1], key[2])
        except IndexUnreachable as exc:
            with guard:
                dead.setdefault(key[0], exc)
            return None, None

    asked = 0
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(one, key): key for key in keys}
        for future in as_completed(futures):
            files, cached = future.result()
            if cached is None:
                continue
            answers[futures[future]] = files
            if not cached:
                asked += 1
                if asked % 50 == 0 or asked == to_ask:
                    say(f"  {asked}/{to_ask} asked ({time.monotonic() - started:.0f} s)")
    return answers, dead, asked


def check(lock: Lock, lock_file: Path, *, env: Mapping[str, str] = os.environ,
          get: Callable[[str], bytes | None] | None = None, jobs: int = JOBS,
          out: Callable[[str], None] = print, say: Callable[[str], None] | None = None) -> None:
    """Print one line per file (and every failing and sdist-only line); raise CheckFailed if a line fails,
    IndexUnreachable if an index could not be asked (after reporting what could be checked)."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    started = time.monotonic()
    wanted = targets(lock, lock_file)
    get = get or Getter()
    cache = lock_file.resolve().parent / CACHE
    base, note = index_url(env)
    if note:
        say(f"lock --check-wheels: {note}")
    torch_url = env.get("TORCH_INDEX_URL") or lock.indexes.get("torch_x86_64")
    indexes: dict[str, JsonIndex | SimpleIndex] = {"pypi": JsonIndex(base, cache, get)}
    indexes["torch"] = SimpleIndex(torch_url, cache, get) if torch_url else indexes["pypi"]
    answers, dead, asked = fetch(wanted, indexes, jobs, say)
    for name, index in indexes.items():
        got = [files for (i, _, _), files in answers.items() if i == name]
        if name not in dead and len(got) >= 3 and all(files is None for files in got):
            dead[name] = IndexUnreachable(f"{index.label} has none of the {len(got)} releases asked: it does not "
                                          f"serve {index.api}; {index.hint} (its answers are in {index.cache})")
    py = tuple(int(x) for x in lock.python.split(".")[:2])
    verdicts = {}
    for t in wanted:
        key = (t.index, t.name, t.version)
        verdicts[t] = Verdict("unchecked") if t.index in dead or key not in answers else \
            judge(t, answers[key], py, _glibc(t.arch), indexes[t.index].label)
    failed = report(wanted, verdicts, out)
    unchecked = sum(v.status == "unchecked" for v in verdicts.values())
    out(f"lock --check-wheels: {len(wanted)} lines for CPython {lock.python}: {failed} failed, "
        f"{sum(v.status == 'sdist' for v in verdicts.values())} sdist-only, {unchecked} not checked; "
        f"{asked} answers asked of the index, {len(answers) - asked} from {CACHE}, {time.monotonic() - started:.1f} s")
    # The torch index serves only the x86_64 torch pins (the aarch64 nodes' torch is PyPI's, checked above): out of
    # reach, they are named as not checked and the check stands on the rest; the main index out of reach fails it.
    if "torch" in dead and indexes["torch"] is not indexes["pypi"]:
        say(f"lock --check-wheels: not checked: the x86_64 torch pins ({dead.pop('torch')}); the aarch64 image "
            "takes torch from the main index, checked above")
    if dead:
        raise IndexUnreachable("; ".join(dict.fromkeys(str(dead[name]) for name in sorted(dead))))
    if failed:
        raise CheckFailed(f"{failed} line(s) of the hashed Python lock or the lock's pins have no file pip would "
                          "install (FAIL lines above): the image build would stop there")


def _glibc(arch: str) -> tuple[int, int]:
    match = re.search(r"manylinux_(\d+)_(\d+)$", pylock.PLATFORMS[arch])
    if not match:
        raise LockError(f"pylock.PLATFORMS[{arch!r}] = {pylock.PLATFORMS[arch]!r}: not <arch>-manylinux_X_Y")
    return int(match.group(1)), int(match.group(2))


def report(wanted: list[Target], verdicts: Mapping[Target, Verdict], out: Callable[[str], None]) -> int:
    """One line per group, then its FAIL and sdist-only lines; returns how many failed."""
    failed = 0
    for group, members in _groups(wanted):
        count = {s: sum(verdicts[t].status == s for t in members) for s in ("ok", "sdist", "fail", "unchecked")}
        parts = [f"{count['ok']} wheel"] + [f"{count[s]} {word}" for s, word in
                                             (("sdist", "sdist-only"), ("fail", "FAILED"), ("unchecked", "not checked"))
                                             if count[s]]
        out(f"{group}: {len(members)} lines: {', '.join(parts)}")
        for t in members:
            verdict = verdicts[t]
            if verdict.status == "fail":
                out(f"  FAIL {t.where}: {t.name}=={t.version}: {verdict.why}")
            elif verdict.status == "sdist":
                out(f"  sdist-only {t.where}: {t.name}=={t.version}: {verdict.why} is built from source at image "
                    f"build on {t.arch}")
        failed += count["fail"]
    return failed


def _groups(wanted: list[Target]) -> Iterator[tuple[str, list[Target]]]:
    order: dict[str, list[Target]] = {}
    for t in wanted:
        order.setdefault(t.group, []).append(t)
    yield from order.items()
