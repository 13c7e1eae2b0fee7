"""`rollout8 lock --check-wheels` (make lock-check): every line of the hashed Python lock, and every PyPI pin, has a
file on the index that pip installs on CPython 3.10 manylinux for that line's architecture. A fake index (an
injected GET over a dict of answers, or a file:// directory) stands in for PyPI: no network.

- an aarch64 line fails, named by file:line and name==version, when the only file with its locked hash is an
  x86_64 wheel, when the version is not on the index, when no file has a locked hash, when only cp311 wheels do;
- it passes on a cp310 manylinux2014_aarch64 wheel, an abi3 wheel, a py3-none-any wheel; an sdist counts (listed
  as sdist-only) unless the Dockerfile passes --only-binary;
- the pins: torch on x86_64 from the torch index's simple page (2.7.1+cpu for ==2.7.1), the others from PyPI;
- a re-run asks nothing (the answers are cached, one file per name and version); an unreachable index is one line
  naming it and what to set, exit non-zero; an index without the JSON API is not read as "every version missing".
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rollout8 import pylock, wheelcheck
from rollout8.cli import main
from rollout8.errors import CheckFailed, IndexUnreachable
from rollout8.fileutil import sha256_bytes
from rollout8.lock import load_lock, normalize
from rollout8.pyindex import FetchFailed, Getter, IndexFile, simple_files

ROOT = Path(__file__).resolve().parents[2]
PY, GLIBC = (3, 10), (2, 35)
PYPI = "https://pypi.org"
TORCH = "https://download.pytorch.org/whl/cpu"


def sha(filename: str) -> str:
    return sha256_bytes(filename)


class FakeIndex:
    """GET over answers: PyPI's JSON API (name, version) -> files, and the torch index's simple pages."""

    def __init__(self) -> None:
        self.releases: dict[tuple[str, str], list[tuple[str, str | None]]] = {}
        self.simple: dict[str, list[str]] = {}
        self.asked: list[str] = []
        self.project_pages_only = False

    def add(self, name: str, version: str, *filenames: str, requires_python: str | None = None) -> None:
        self.releases.setdefault((name, version), []).extend((f, requires_python) for f in filenames)

    def _urls(self, files: list[tuple[str, str | None]]) -> list[dict]:
        return [{"filename": f, "digests": {"sha256": sha(f)}, "requires_python": rp, "packagetype": "x"}
                for f, rp in files]

    def __call__(self, url: str) -> bytes | None:
        self.asked.append(url)
        if url.startswith(f"{PYPI}/pypi/"):
            parts = url[len(f"{PYPI}/pypi/"):].split("/")
            if len(parts) == 3 and not self.project_pages_only:  # <name>/<version>/json
                files = self.releases.get((parts[0], parts[1]))
                return None if files is None else json.dumps({"urls": self._urls(files)}).encode()
            if len(parts) == 2:  # <name>/json
                releases = {v: self._urls(f) for (n, v), f in self.releases.items() if n == parts[0]}
                return json.dumps({"releases": releases}).encode() if releases else None
            return None
        if url.startswith(f"{TORCH}/"):
            links = self.simple.get(url[len(TORCH) + 1:].strip("/"))
            if links is None:
                return None
            anchors = "".join(f'<a href="/whl/cpu/{f.replace("+", "%2B")}#sha256={sha(f)}">{f}</a><br/>\n'
                              for f in links)
            return f"<!DOCTYPE html><html><body>{anchors}</body></html>".encode()
        raise AssertionError(f"unexpected URL {url}")


@pytest.fixture
def lock_tree(tmp_path):
    """A checkout's shape: the real lock, docker/Dockerfile, docker/requirements/ with empty layer files."""
    shutil.copy(ROOT / "versions.lock.yaml", tmp_path / "versions.lock.yaml")
    (tmp_path / "docker" / "requirements").mkdir(parents=True)
    (tmp_path / "docker" / "Dockerfile").write_text("RUN python3 -m pip install --require-hashes --no-deps -r r.txt\n")
    for arch in ("aarch64", "x86_64"):
        (tmp_path / "docker" / "requirements" / f"stack-{arch}.txt").write_text("# header\n")
    return tmp_path


@pytest.fixture
def index(lock_tree):
    """Every pin of the lock served as it really is: a cp310 wheel per architecture (torch x86_64: +cpu)."""
    fake = FakeIndex()
    lock = load_lock(lock_tree / "versions.lock.yaml")
    for name, version in lock.pypi.items():
        dist = normalize(name).replace("-", "_")
        fake.add(normalize(name), version, f"{dist}-{version}-cp310-cp310-manylinux_2_28_aarch64.whl",
                 f"{dist}-{version}-cp310-cp310-manylinux_2_28_x86_64.whl")
    torch = lock.pypi["torch"]
    fake.simple["torch"] = [f"torch-{torch}+cpu-cp310-cp310-manylinux_2_28_x86_64.whl",
                            f"torch-{torch}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]
    return fake


def write_layer(tree: Path, arch: str, *lines: tuple[str, str, list[str]]) -> Path:
    """stack-<arch>.txt with a header and name==version \\ --hash lines, as uv writes them."""
    path = tree / "docker" / "requirements" / f"stack-{arch}.txt"
    text = "# docker/requirements/stack: generated\n# inputs sha256: 0\n"
    for name, version, files in lines:
        text += f"{name}=={version}" + "".join(f" \\\n    --hash=sha256:{sha(f)}" for f in files) + "\n"
    path.write_text(text)
    return path


def run(tree: Path, fake, capsys, **env):
    lock_file = tree / "versions.lock.yaml"
    said: list[str] = []
    outcome = None
    try:
        wheelcheck.check(load_lock(lock_file), lock_file, env=env, get=fake, jobs=4, say=said.append)
    except (CheckFailed, IndexUnreachable) as exc:
        outcome = exc
    return capsys.readouterr().out, outcome, said


def fail_lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("FAIL ")]


# ------------------------------------------------------------------------------------------ a line fails, named

def test_an_aarch64_line_whose_only_locked_file_is_an_x86_64_wheel_fails_naming_the_line(lock_tree, index, capsys):
    x86 = "fastfoo-1.2.0-cp310-cp310-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    index.add("fastfoo", "1.2.0", x86, "fastfoo-1.2.0-cp310-cp310-manylinux_2_17_aarch64.whl")
    write_layer(lock_tree, "aarch64", ("fastfoo", "1.2.0", [x86]))  # the aarch64 wheel's hash is not locked
    write_layer(lock_tree, "x86_64", ("fastfoo", "1.2.0", [x86]))
    out, outcome, _ = run(lock_tree, index, capsys)
    assert isinstance(outcome, CheckFailed)
    assert fail_lines(out) == [
        "FAIL docker/requirements/stack-aarch64.txt:3: fastfoo==1.2.0: files with a locked hash exist but none "
        "installs on CPython 3.10 manylinux (glibc 2.35) aarch64 (found: cp310-cp310-manylinux_2_17_x86_64."
        "manylinux2014_x86_64)"]
    assert "docker/requirements/stack-x86_64.txt: 1 lines: 1 wheel" in out


def test_a_version_missing_from_the_index_fails(lock_tree, index, capsys):
    index.add("gone", "1.0.0", "gone-1.0.0-py3-none-any.whl")
    write_layer(lock_tree, "aarch64", ("numpy-ish", "0.1", ["x"]), ("gone", "2.0.0", ["gone-2.0.0-py3-none-any.whl"]))
    index.add("numpy-ish", "0.1", "x")  # not a wheel, not an sdist: fails too
    out, outcome, _ = run(lock_tree, index, capsys)
    assert isinstance(outcome, CheckFailed)
    assert "FAIL docker/requirements/stack-aarch64.txt:5: gone==2.0.0: no such version on https://pypi.org" \
        in fail_lines(out)


def test_a_locked_hash_matching_no_file_fails(lock_tree, index, capsys):
    index.add("edited", "3.1", "edited-3.1-py3-none-any.whl", "edited-3.1.tar.gz")
    write_layer(lock_tree, "aarch64", ("edited", "3.1", ["a file that was never uploaded"]))
    out, outcome, _ = run(lock_tree, index, capsys)
    assert isinstance(outcome, CheckFailed)
    assert fail_lines(out) == ["FAIL docker/requirements/stack-aarch64.txt:3: edited==3.1: no file with a locked "
                               "hash (https://pypi.org has 2: py3-none-any, sdist)"]


def test_a_cp311_only_wheel_fails(lock_tree, index, capsys):
    wheels = ["newpy-0.9-cp311-cp311-manylinux_2_17_aarch64.whl", "newpy-0.9-cp312-abi3-manylinux_2_17_aarch64.whl"]
    index.add("newpy", "0.9", *wheels)
    write_layer(lock_tree, "aarch64", ("newpy", "0.9", wheels))
    out, outcome, _ = run(lock_tree, index, capsys)
    assert isinstance(outcome, CheckFailed)
    assert fail_lines(out) == ["FAIL docker/requirements/stack-aarch64.txt:3: newpy==0.9: files with a locked hash "
                               "exist but none installs on CPython 3.10 manylinux (glibc 2.35) aarch64 (found: "
                               "cp311-cp311-manylinux_2_17_aarch64, cp312-abi3-manylinux_2_17_aarch64)"]
    assert "1 failed" in out.splitlines()[-1]


# ------------------------------------------------------------------------------------------ and passes

def test_cp310_manylinux2014_abi3_and_py3_none_any_wheels_pass(lock_tree, index, capsys):
    lines = [("native", "1.0", ["native-1.0-cp310-cp310-manylinux2014_aarch64.whl"]),
             ("stable", "2.0", ["stable-2.0-cp38-abi3-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"]),
             ("pure", "3.0", ["pure-3.0-py3-none-any.whl"])]
    for name, version, files in lines:
        index.add(name, version, *files)
    write_layer(lock_tree, "aarch64", *lines)
    out, outcome, _ = run(lock_tree, index, capsys)
    assert outcome is None, out
    assert fail_lines(out) == []
    assert "docker/requirements/stack-aarch64.txt: 3 lines: 3 wheel" in out
    pins = 2 * len(load_lock(lock_tree / "versions.lock.yaml").pypi)
    assert f"versions.lock.yaml (pypi pins, by exact version): {pins} lines: {pins} wheel" in out


def test_an_sdist_counts_and_is_listed_unless_the_build_passes_only_binary(lock_tree, index, capsys):
    index.add("antlrish", "4.9.3", "antlrish-4.9.3.tar.gz")
    write_layer(lock_tree, "aarch64", ("antlrish", "4.9.3", ["antlrish-4.9.3.tar.gz"]))
    out, outcome, _ = run(lock_tree, index, capsys)
    assert outcome is None
    assert "sdist-only docker/requirements/stack-aarch64.txt:3: antlrish==4.9.3: antlrish-4.9.3.tar.gz is built " \
           "from source at image build on aarch64" in out
    dockerfile = lock_tree / "docker" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("--no-deps", "--no-deps --only-binary=:all:"))
    out, outcome, _ = run(lock_tree, index, capsys)
    assert isinstance(outcome, CheckFailed)
    assert fail_lines(out)[0].endswith("(found: sdist); sdists do not count: the build passes --only-binary")


def test_the_pins_need_a_cp310_wheel_per_arch_and_x86_64_torch_comes_from_the_torch_index(lock_tree, index, capsys):
    lock = load_lock(lock_tree / "versions.lock.yaml")
    out, outcome, _ = run(lock_tree, index, capsys)
    assert outcome is None, out
    assert any(url.startswith(f"{TORCH}/torch/") for url in index.asked)  # torch+cpu, not PyPI's CUDA build
    ray = lock.pypi["ray"]
    index.releases[("ray", ray)] = [(f"ray-{ray}-cp311-cp311-manylinux2014_aarch64.whl", None),
                                    (f"ray-{ray}-cp310-cp310-manylinux2014_x86_64.whl", None)]
    index.simple["torch"] = [f"torch-{lock.pypi['torch']}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]
    shutil.rmtree(lock_tree / ".cache")
    out, outcome, _ = run(lock_tree, index, capsys)
    assert isinstance(outcome, CheckFailed)
    assert [line.split(":")[0] for line in fail_lines(out)] == ["FAIL versions.lock.yaml pypi.torch (x86_64)",
                                                                "FAIL versions.lock.yaml pypi.ray (aarch64)"]


# ------------------------------------------------------------------------------------------ the rules, one by one

@pytest.mark.parametrize("filename, ok", [
    ("a-1-cp310-cp310-manylinux_2_17_aarch64.manylinux2014_aarch64.whl", True),
    ("a-1-cp310-cp310-manylinux_2_35_aarch64.whl", True),
    ("a-1-cp310-cp310-manylinux_2_39_aarch64.whl", False),  # newer glibc than Ubuntu 22.04's
    ("a-1-cp310-cp310-musllinux_1_2_aarch64.whl", False),
    ("a-1-cp310-cp310-linux_aarch64.whl", True),
    ("a-1-cp39-abi3-manylinux2014_aarch64.whl", True),
    ("a-1-cp311-abi3-manylinux2014_aarch64.whl", False),
    ("a-1-cp39-cp39-manylinux2014_aarch64.whl", False),
    ("a-1-cp311-none-manylinux2014_aarch64.whl", False),
    ("a-1-cp310-none-manylinux2014_aarch64.whl", True),
    ("a-1-py2.py3-none-any.whl", True),
    ("a-1-py310-none-any.whl", True),
    ("a-1-py311-none-any.whl", False),
    ("a-1-cp310-none-any.whl", True),
    ("a-1-cp310-cp310-any.whl", False),  # pip never pairs a CPython ABI with `any`
    ("a-1-1build-py3-none-manylinux1_aarch64.whl", True),
    ("a-1-cp310-cp310-win_arm64.whl", False),
    ("a-1-cp310-cp310-macosx_11_0_arm64.whl", False),
])
def test_the_tags_pip_takes_on_cpython_310_aarch64(filename, ok):
    assert wheelcheck.wheel_installs(filename, "aarch64", PY, GLIBC) is ok


@pytest.mark.parametrize("spec, ok", [
    (None, True), (">=3.8", True), (">=3.11", False), ("<3.10", False), (">=3.9,<3.13", True), ("~=3.9", True),
    ("~=3.11", False), ("!=3.10.*", False), ("==3.10.*", True), (">=2.7, !=3.0.*, !=3.1.*", True), ("==3.9", False),
    ("something odd", True),
])
def test_requires_python(spec, ok):
    assert wheelcheck.python_admits(spec, PY) is ok


def test_a_wheel_whose_requires_python_excludes_310_does_not_count(lock_tree, index, capsys):
    index.add("modern", "5.0", "modern-5.0-py3-none-any.whl", requires_python=">=3.11")
    write_layer(lock_tree, "aarch64", ("modern", "5.0", ["modern-5.0-py3-none-any.whl"]))
    out, outcome, _ = run(lock_tree, index, capsys)
    assert isinstance(outcome, CheckFailed)
    assert fail_lines(out)[0].endswith("(found: py3-none-any [requires-python >=3.11])")


def test_parse_layer_numbers_each_entry_by_its_name_line():
    path = pylock.layer_file(pylock.requirements_dir(ROOT / "versions.lock.yaml"), "stack", "aarch64")
    lines = path.read_text().splitlines()
    entries = pylock.parse_layer(path)
    assert len(entries) > 50
    for entry in entries:
        assert normalize(lines[entry.line - 1].split("==")[0]) == entry.name, entry
    assert len({e.line for e in entries}) == len(entries)


def test_simple_page_links_carry_name_hash_and_requires_python():
    page = ('<a href="https://files.example/torch-2.7.1%2Bcpu-cp310-cp310-manylinux_2_28_x86_64.whl#sha256='
            f'{"ab" * 32}" data-requires-python="&gt;=3.9.0">x</a><a href="nohash-1.0.tar.gz">y</a>')
    assert simple_files(page, f"{TORCH}/torch/") == [
        IndexFile("torch-2.7.1+cpu-cp310-cp310-manylinux_2_28_x86_64.whl", "ab" * 32, ">=3.9.0")]


# ------------------------------------------------------------------------------------------ asking the index

def test_a_rerun_asks_nothing_and_each_answer_is_one_file(lock_tree, index, capsys):
    index.add("pure", "3.0", "pure-3.0-py3-none-any.whl")
    write_layer(lock_tree, "aarch64", ("pure", "3.0", ["pure-3.0-py3-none-any.whl"]), ("gone", "1", ["x"]))
    out, _, said = run(lock_tree, index, capsys)
    first = len(index.asked)
    assert first > 0 and any("asking" in line for line in said)
    cache = lock_tree / ".cache" / "index-json"
    answer = json.loads((cache / "pypi.org" / "pure" / "3.0.json").read_text())
    assert answer["found"] is True and answer["files"][0]["filename"] == "pure-3.0-py3-none-any.whl"
    assert json.loads((cache / "pypi.org" / "gone" / "1.json").read_text())["found"] is False
    assert not [p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".json")]  # no temporaries left
    again, _, said = run(lock_tree, index, capsys)
    assert len(index.asked) == first and said == []
    assert "0 answers asked of the index" in again.splitlines()[-1]
    assert fail_lines(again) == fail_lines(out) == [
        "FAIL docker/requirements/stack-aarch64.txt:5: gone==1: no such version on https://pypi.org"]


def test_an_index_serving_project_pages_only_is_read_through_them(lock_tree, index, capsys):
    index.project_pages_only = True
    index.add("pure", "3.0", "pure-3.0-py3-none-any.whl")
    write_layer(lock_tree, "aarch64", ("pure", "3.0", ["pure-3.0-py3-none-any.whl"]))
    out, outcome, _ = run(lock_tree, index, capsys)
    assert outcome is None, out
    per_version = [u for u in index.asked if u.endswith("/json") and u.count("/") == 6]
    assert len(per_version) < 5  # it stops asking the per-version endpoint once it knows


def test_an_unreachable_index_is_one_line_naming_it_and_what_to_set(lock_tree, capsys):
    def down(url):
        raise FetchFailed(url, "[Errno -2] Name or service not known (3 attempts, 20 s timeout each)")

    write_layer(lock_tree, "aarch64", ("pure", "3.0", ["pure-3.0-py3-none-any.whl"]))
    out, outcome, _ = run(lock_tree, down, capsys)
    assert isinstance(outcome, IndexUnreachable)
    message = str(outcome)
    assert "\n" not in message
    assert message.startswith("cannot ask the package index https://pypi.org: [Errno -2] Name or service not known")
    assert "ROLLOUT8_INDEX_URL" in message
    assert "not checked" in out and fail_lines(out) == []


def test_only_the_torch_index_out_of_reach_leaves_the_x86_64_torch_pins_named_as_not_checked(lock_tree, index,
                                                                                             capsys):
    """The torch index serves only the x86_64 torch pins (an aarch64 image takes torch from PyPI): out of reach
    (as download.pytorch.org is from a machine that reaches only PyPI), the check stands on everything else."""
    def torch_down(url):
        if url.startswith(TORCH):
            raise FetchFailed(url, "[Errno -2] Name or service not known (3 attempts, 20 s timeout each)")
        return index(url)

    index.add("pure", "3.0", "pure-3.0-py3-none-any.whl")
    write_layer(lock_tree, "aarch64", ("pure", "3.0", ["pure-3.0-py3-none-any.whl"]))
    out, outcome, said = run(lock_tree, torch_down, capsys)
    err = "\n".join(said)
    assert outcome is None and fail_lines(out) == [], (outcome, out)
    assert "not checked: the x86_64 torch pins (cannot ask the package index https://download.pytorch.org" in err
    assert "TORCH_INDEX_URL" in err


def test_an_index_without_the_json_api_is_not_every_version_missing(lock_tree, index, capsys):
    write_layer(lock_tree, "aarch64", *[(f"p{i}", "1.0", [f"p{i}-1.0-py3-none-any.whl"]) for i in range(4)])
    out, outcome, _ = run(lock_tree, lambda url: None, capsys, PIP_INDEX_URL="https://mirror.example/simple/")
    assert isinstance(outcome, IndexUnreachable)
    assert str(outcome).startswith("https://mirror.example has none of the")
    assert "does not serve the PyPI JSON API" in str(outcome)


def test_the_index_url_comes_from_rollout8_index_url_or_a_simple_pip_index_url():
    assert wheelcheck.index_url({}) == (PYPI, None)
    assert wheelcheck.index_url({"PIP_INDEX_URL": "https://m.example/pypi/simple"}) == ("https://m.example/pypi", None)
    assert wheelcheck.index_url({"ROLLOUT8_INDEX_URL": "https://j.example", "PIP_INDEX_URL": "https://m/simple"}) \
        == ("https://j.example", None)
    url, note = wheelcheck.index_url({"PIP_INDEX_URL": "https://user:secret@m.example/packages"})
    assert url == PYPI and "m.example/packages" in note and "secret" not in note


def test_a_get_is_bounded_in_time_and_attempts():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    slept = []
    get = Getter(timeout=2, attempts=3, backoff=1, sleep=slept.append)
    with pytest.raises(FetchFailed) as caught:
        get(f"http://127.0.0.1:{port}/pypi/x/1/json")
    assert slept == [1, 2] and "3 attempts, 2 s timeout each" in str(caught.value)


def test_the_cli_reads_a_local_directory_index_and_exits_1_naming_the_line(lock_tree, index, capsys, monkeypatch):
    """`rollout8 lock --check-wheels` end to end, over a file:// directory laid out like PyPI's JSON API."""
    folder = lock_tree / "fake-index"
    for (name, version), files in index.releases.items():
        page = folder / "pypi" / name / version / "json"
        page.parent.mkdir(parents=True)
        page.write_text(json.dumps({"urls": index._urls(files)}))
    torch_page = folder / "torch" / "torch" / "index.html"
    torch_page.parent.mkdir(parents=True)
    torch_page.write_bytes(index(f"{TORCH}/torch/"))
    x86 = "fastfoo-1.2.0-cp310-cp310-manylinux2014_x86_64.whl"
    (folder / "pypi" / "fastfoo" / "1.2.0").mkdir(parents=True)
    (folder / "pypi" / "fastfoo" / "1.2.0" / "json").write_text(json.dumps({"urls": index._urls([(x86, None)])}))
    write_layer(lock_tree, "aarch64", ("fastfoo", "1.2.0", [x86]))
    monkeypatch.setenv("ROLLOUT8_INDEX_URL", folder.as_uri())
    monkeypatch.setenv("TORCH_INDEX_URL", (folder / "torch").as_uri())
    code = main(["lock", "--lock", str(lock_tree / "versions.lock.yaml"), "--check-wheels"])
    captured = capsys.readouterr()
    assert code == 1
    assert fail_lines(captured.out) == [
        "FAIL docker/requirements/stack-aarch64.txt:3: fastfoo==1.2.0: files with a locked hash exist but none "
        "installs on CPython 3.10 manylinux (glibc 2.35) aarch64 (found: cp310-cp310-manylinux2014_x86_64)"]
    assert "rollout8 lock: error: 1 line(s)" in captured.err
    assert not (lock_tree / ".cache").exists()  # a local directory is not cached
