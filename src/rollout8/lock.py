"""`rollout8 lock`: the version lock (versions.lock.yaml) as a typed model, and everything generated from it.

The lock is the only place a pin is written. This module validates it (full 40-hex commit ids, exact PyPI
versions, sha256 slots empty or 64 hex, ...) with errors that name the field, and renders it as:

- a human table (default),
- `--build-args`: the `--build-arg K=V` list for `docker build` (the Makefile's `image` target uses it),
- `--env`: KEY=VALUE lines (the same keys as the build args),
- `--markdown`: the README's version table,
- `--constraints`: the PyPI pins as a pip constraints file (`make python-lock` resolves the hashed lock under them),
- `--json`: the whole lock plus the derived values,
- `--get KEY`: one derived value (`image`, `digest`, or any build-arg KEY),
- `--cann-files [DIR]`: the CANN installers the lock expects, checked against those in DIR (docker/cann),
- `--update-readme FILE`: rewrite the table between the README's `<!-- versions:begin/end -->` markers.

It needs only pyyaml and pydantic, so the Makefile can run it with the system python3 before .venv exists:
`PYTHONPATH=src python3 -m rollout8 lock --build-args`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from .errors import LockError
from .fileutil import atomic_write, sha256_file, sha256_json
from .models import FrozenModel
from .paths import lock_path
from .yamlio import load_yaml, read_text, read_yaml

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# An exact PEP 440 version: release segments, optional pre/post/dev, no operators, no wildcards, no local part
# (a local part such as +cpu is what an index serves, not what we pin).
EXACT_VERSION_RE = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")
PYTHON_RE = re.compile(r"^3\.\d+$")
ARCHES = ("aarch64", "x86_64")
INSTALLER_KINDS = ("toolkit", "kernels", "nnal")
# Distribution names that are pinned by the lock and so must never appear among the unpinned deps.
_NORMALIZE = re.compile(r"[-_.]+")


def normalize(name: str) -> str:
    """PEP 503 name normalization (torch_npu == torch-npu)."""
    return _NORMALIZE.sub("-", name).lower()


class ImageSpec(FrozenModel):
    repository: str = Field(min_length=1)

    @field_validator("repository")
    @classmethod
    def _no_tag(cls, v: str) -> str:
        if ":" in v.rsplit("/", 1)[-1] or "@" in v:
            raise ValueError("give the repository only; the tag is computed from the lock")
        return v


class BaseImage(FrozenModel):
    name: str = Field(min_length=1)
    digest: str = ""

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str) -> str:
        if v and not DIGEST_RE.match(v):
            raise ValueError(f"must be empty or 'sha256:' followed by 64 lowercase hex digits, got {v!r}")
        return v

    @property
    def reference(self) -> str:
        return f"{self.name}@{self.digest}" if self.digest else self.name


class Installer(FrozenModel):
    file: str = Field(min_length=1)
    sha256: str = ""

    @field_validator("file")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if "/" in v or v.startswith("."):
            raise ValueError(f"must be a plain file name inside docker/cann/, got {v!r}")
        return v

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if v and not SHA256_RE.match(v):
            raise ValueError(f"must be empty or 64 lowercase hex digits (sha256sum output), got {v!r}")
        return v


class Cann(FrozenModel):
    version: str = Field(min_length=1)
    installers: dict[Literal["toolkit", "kernels", "nnal"], dict[Literal["aarch64", "x86_64"], Installer]]

    @model_validator(mode="after")
    def _complete(self) -> Cann:
        for kind in INSTALLER_KINDS:
            if kind not in self.installers:
                raise ValueError(f"installers.{kind} is missing (need toolkit, kernels and nnal)")
            for arch in ARCHES:
                if arch not in self.installers[kind]:
                    raise ValueError(f"installers.{kind}.{arch} is missing (need aarch64 and x86_64)")
                if self.version not in self.installers[kind][arch].file:
                    raise ValueError(f"installers.{kind}.{arch}.file does not carry the CANN version {self.version}")
        return self


class GitPin(FrozenModel):
    url: str
    commit: str
    note: str = ""

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https://\S+$", v):
            raise ValueError(f"must be an https:// clone URL, got {v!r}")
        return v

    @field_validator("commit")
    @classmethod
    def _commit(cls, v: str) -> str:
        if not COMMIT_RE.match(v):
            raise ValueError(f"must be a full 40-hex commit id (lowercase), got {v!r}; a tag or branch name floats")
        return v


class Lock(FrozenModel):
    schema_: Literal[1] = Field(alias="schema")
    image: ImageSpec
    python: str
    base_image: BaseImage
    cann: Cann
    pypi: dict[str, str]
    node_python: dict[str, str] = Field(default_factory=dict)
    indexes: dict[str, str] = Field(default_factory=dict)
    unpinned_deps: dict[str, list[str]] = Field(default_factory=dict)
    git: dict[str, GitPin]
    soc_version: str
    # sha256 of each hashed Python lock file's entries (docker/requirements/<layer>-<arch>.txt: name, version and
    # hashes), written by `make python-lock`: the digest, so the image tag, covers the bytes the image installs
    python_lock: dict[str, str] = Field(default_factory=dict)

    @field_validator("python_lock")
    @classmethod
    def _python_lock(cls, v: dict[str, str]) -> dict[str, str]:
        for name, digest in v.items():
            if not re.match(r"^[a-z0-9-]+-(aarch64|x86_64)$", str(name)):
                raise ValueError(f"{name!r}: a key is a layer file's name without .txt, such as stack-aarch64")
            if not isinstance(digest, str) or not re.match(r"^[0-9a-f]{64}$", digest):
                raise ValueError(f"{name}: must be 64 lowercase hex digits (a sha256), got {digest!r}")
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not PYTHON_RE.match(v):
            raise ValueError(f"must be a quoted MAJOR.MINOR string such as \"3.10\", got {v!r}")
        return v

    @field_validator("pypi", "node_python")
    @classmethod
    def _exact(cls, v: dict[str, str]) -> dict[str, str]:
        for name, version in v.items():
            if not isinstance(version, str) or not EXACT_VERSION_RE.match(version):
                raise ValueError(f"{name}: must be an exact version such as \"2.7.1\" (quoted), got {version!r}")
        return v

    @field_validator("indexes")
    @classmethod
    def _indexes(cls, v: dict[str, str]) -> dict[str, str]:
        for name, url in v.items():
            if not re.match(r"^https://\S+$", url):
                raise ValueError(f"{name}: must be an https:// index URL, got {url!r}")
        return v

    @field_validator("soc_version")
    @classmethod
    def _soc(cls, v: str) -> str:
        if not re.match(r"^ASCEND[0-9A-Z]+$", v):
            raise ValueError(f"must look like ASCEND910B1, got {v!r}")
        return v

    @model_validator(mode="after")
    def _deps_do_not_touch_pins(self) -> Lock:
        pinned = {normalize(n) for n in [*self.pypi, *self.git, "torch-npu", "megatron-core", "vllm-ascend"]}
        for owner, reqs in self.unpinned_deps.items():
            for i, req in enumerate(reqs):
                name = re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]
                if normalize(name) in pinned:
                    raise ValueError(f"unpinned_deps.{owner}[{i}] = {req!r} is pinned: keep it in pypi/git only")
        return self

    # ------------------------------------------------------------------ derived values

    def digest(self) -> str:
        """sha256 over the canonical JSON of the lock's content (comments and layout do not count)."""
        return sha256_json(self.model_dump(mode="json", by_alias=True), compact=True)

    def image_ref(self, version: str | None = None) -> str:
        if version is None:
            from . import __version__ as version
        return f"{self.image.repository}:{version}-{self.digest()[:12]}"

    def build_args(self) -> dict[str, str]:
        """Every pin as a docker build arg. Key names: <PYPI NAME>_VERSION, <GIT NAME>_REPO / _COMMIT, CANN_*."""
        args: dict[str, str] = {
            "PYTHON_VERSION": self.python,
            "UBUNTU_IMAGE": self.base_image.reference,
            "CANN_VERSION": self.cann.version,
        }
        for kind in INSTALLER_KINDS:
            for arch in ARCHES:
                inst = self.cann.installers[kind][arch]
                suffix = f"{kind.upper()}_{arch.upper()}"
                args[f"CANN_{suffix}_FILE"] = inst.file
                args[f"CANN_{suffix}_SHA256"] = inst.sha256
        for name, version in self.pypi.items():
            args[f"{_key(name)}_VERSION"] = version
        for name, pin in self.git.items():
            args[f"{_key(name)}_REPO"] = pin.url
            args[f"{_key(name)}_COMMIT"] = pin.commit
        for name, url in self.indexes.items():
            args[f"{_key(name)}_INDEX"] = url
        args["SOC_VERSION"] = self.soc_version
        args["ROLLOUT8_LOCK_DIGEST"] = self.digest()
        return args

    def constraint_lines(self) -> list[str]:
        return [f"{normalize(n)}=={v}" for n, v in sorted(self.pypi.items())]

    def node_python_requirements(self) -> str:
        """The nodes' Python libraries (node_python) as pip requirement lines."""
        return "".join(f"{normalize(n)}=={v}\n" for n, v in sorted(self.node_python.items()))

    def constraints(self) -> str:
        lines = ["# generated by `rollout8 lock --constraints` from versions.lock.yaml: do not edit"]
        return "\n".join(lines + self.constraint_lines()) + "\n"

    def rows(self) -> list[tuple[str, str, str]]:
        """(component, pin, source) rows for the human table and the README."""
        rows = [
            ("python", self.python, f"system Python of {self.base_image.name}"),
            ("base image", self.base_image.reference, "digest slot empty: tag as served" if not self.base_image.digest
             else "frozen by digest"),
        ]
        filled = sum(bool(self.cann.installers[k][a].sha256) for k in INSTALLER_KINDS for a in ARCHES)
        rows.append(("CANN", self.cann.version,
                     f"toolkit, kernels, nnal installers; {filled}/{len(INSTALLER_KINDS) * len(ARCHES)} sha256 filled"))
        for name, version in self.pypi.items():
            rows.append((name, version, "PyPI"))
        for name, pin in self.git.items():
            rows.append((name, pin.commit, pin.url + (f" ({pin.note})" if pin.note else "")))
        rows.append(("SOC_VERSION", self.soc_version, "vllm-ascend custom kernels target"))
        return rows


def _key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).upper()


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_lock(path: Path | str | None = None) -> Lock:
    """Read and validate the lock; LockError names the file and the field."""
    path = Path(path) if path is not None else lock_path()
    try:
        data = read_yaml(path, what="version lock", error=LockError)
    except FileNotFoundError:
        raise LockError(f"{path}: version lock not found") from None
    if not isinstance(data, dict):
        raise LockError(f"{path}: expected a mapping at the top level")
    try:
        return Lock.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{_loc(err['loc']) or '(top level)'}: {msg}")
        raise LockError(f"{path}: " + "; ".join(problems)) from None


# ---------------------------------------------------------------------- output formats

def format_table(lock: Lock) -> str:
    rows = lock.rows()
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{'component':<{w0}}  {'pin':<{w1}}  source", f"{'-' * w0}  {'-' * w1}  ------"]
    lines += [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    lines.append(f"image: {lock.image_ref()}   lock digest: {lock.digest()}")
    return "\n".join(lines)


def format_markdown(lock: Lock) -> str:
    lines = ["| component | pin | source |", "|---|---|---|"]
    for name, pin, source in lock.rows():
        lines.append(f"| {name} | `{pin}` | {source.replace('|', '/')} |")
    return "\n".join(lines)


def format_build_args(lock: Lock) -> str:
    return " ".join(shlex.quote(f"--build-arg={k}={v}") for k, v in lock.build_args().items())


def format_env(lock: Lock) -> str:
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in lock.build_args().items())


def cann_report(lock: Lock, folder: Path) -> tuple[str, bool]:
    """Per installer: the lock's file name, its sha256 slot, and what docker/cann/ holds. ok = nothing blocks."""
    lines, ok = [], True
    for kind in INSTALLER_KINDS:
        for arch in ARCHES:
            inst = lock.cann.installers[kind][arch]
            path = folder / inst.file
            if not path.is_file():
                state = "absent"
            else:
                got = sha256_file(path)
                if not inst.sha256:
                    state, ok = f"present, sha256 {got}: put it in the lock (cann.installers.{kind}.{arch})", False
                elif got != inst.sha256:
                    state, ok = f"present, sha256 {got} DIFFERS from the lock", False
                else:
                    state = "present, sha256 verified"
            lines.append(f"{kind:<8} {arch:<8} {inst.file}  lock sha256: {inst.sha256 or '(empty)'}  {state}")
    return "\n".join(lines), ok


README_BEGIN = "<!-- versions:begin -->"
README_END = "<!-- versions:end -->"


def readme_block(text: str, path: Path | str = "README.md") -> str:
    """The text between the README's version markers (without the marker lines)."""
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise LockError(f"{path}: markers {README_BEGIN} / {README_END} not found (in this order)")
    return text[begin + len(README_BEGIN):end].strip("\n")


def update_readme(lock: Lock, path: Path) -> bool:
    """Rewrite the version table between the markers; True if the file changed."""
    text = read_text(path, what="README", error=LockError)
    readme_block(text, path)  # validates the markers
    begin = text.find(README_BEGIN) + len(README_BEGIN)
    end = text.find(README_END)
    new = text[:begin] + "\n" + format_markdown(lock) + "\n" + text[end:]
    if new == text:
        return False
    atomic_write(path, new, mode=path.stat().st_mode & 0o777)  # a crash never leaves half a README
    return True


def set_base_digest(path: Path, digest: str) -> None:
    """Write base_image.digest into the lock file in place (its comments and layout kept)."""
    if not DIGEST_RE.match(digest):
        raise LockError(f"{digest!r}: a digest is 'sha256:' and 64 lowercase hex digits")
    text = read_text(path, what="version lock", error=LockError)
    new, count = re.subn(r'^(base_image:\n(?:[ \t]+#.*\n|[ \t]+name:.*\n)*[ \t]+digest:[ \t]*)"[^"\n]*"',
                         lambda m: f'{m.group(1)}"{digest}"', text, count=1, flags=re.MULTILINE)
    if count != 1:
        raise LockError(f"{path}: no base_image.digest line found to fill")
    load_lock_text(new, path)
    atomic_write(path, new, mode=path.stat().st_mode & 0o777)


PYTHON_LOCK_COMMENT = (
    "# The hashed Python lock's entries, file by file (sha256 of the names, versions and hashes\n"
    "# of each docker/requirements/<layer>-<arch>.txt): written by `make python-lock`, so the lock's\n"
    "# digest and the image tag cover the bytes the image installs; `rollout8 lock --check` refuses\n"
    "# a file that holds anything else.\n")


def set_python_lock(path: Path, digests: dict[str, str]) -> bool:
    """Write the python_lock block (at the end of the lock file, its comment above it) in place; True if changed."""
    text = read_text(path, what="version lock", error=LockError)
    block = PYTHON_LOCK_COMMENT + "python_lock:\n" + "".join(f"  {k}: {v}\n" for k, v in sorted(digests.items()))
    pattern = re.compile(r"(?:^# The hashed Python lock's entries.*\n(?:^#.*\n)*)?^python_lock:\n(?:^[ \t]+.*\n)*",
                         re.MULTILINE)
    if pattern.search(text):
        new = pattern.sub(lambda m: block, text, count=1)
    else:
        new = text.rstrip("\n") + "\n\n" + block
    if new == text:
        return False
    load_lock_text(new, path)
    atomic_write(path, new, mode=path.stat().st_mode & 0o777)
    return True


def load_lock_text(text: str, path: Path | str) -> Lock:
    data = load_yaml(text, source=path, error=LockError)
    try:
        return Lock.model_validate(data)
    except ValidationError as exc:
        raise LockError(f"{path}: the edited lock does not validate: {exc}") from None


def get_value(lock: Lock, key: str) -> str:
    if key == "version":
        from . import __version__
        return __version__
    if key == "image":
        return lock.image_ref()
    if key == "digest":
        return lock.digest()
    args = lock.build_args()
    if key not in args:
        raise LockError(f"unknown key {key!r}: use version, image, digest or one of {', '.join(args)}")
    return args[key]
