"""The version lock: valid pins only, written once, and everything that follows it agrees with it.

- every git pin is a full 40-hex commit id, every PyPI pin an exact version (and `rollout8 lock` names the field
  when one is not);
- no pin value is hard-coded in any other file of the repository (the README's generated table excepted, which
  must equal `rollout8 lock --markdown`);
- docker/Dockerfile declares every build arg the lock emits, with no default, and labels every pin;
- `make -n image` shows exactly one `docker build`, whose build args are exactly the lock's.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollout8.errors import LockError
from rollout8.lock import (
    COMMIT_RE,
    EXACT_VERSION_RE,
    README_BEGIN,
    README_END,
    format_markdown,
    load_lock,
    normalize,
    readme_block,
)

ROOT = Path(__file__).resolve().parents[2]
LOCK_FILE = ROOT / "versions.lock.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
# Build args of docker/Dockerfile that are not pins (knobs for mirrors, proxies, bases), so may have defaults.
NON_PIN_ARGS = {
    "BASE_IMAGE", "STACK_IMAGE", "TARGETARCH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST",
    "TORCH_INDEX_URL", "ALLOW_UNVERIFIED_CANN",
    # the bundle's own OCI labels (make image computes them from the checkout, not from the lock)
    "ROLLOUT8_VERSION", "ROLLOUT8_REVISION", "ROLLOUT8_SOURCE", "ROLLOUT8_CREATED",
}
# Other spellings of a pinned distribution's name in code (import name, env-var style).
ALIASES = {"flash-llm-rl": ["flash_rl", "flashrl"], "torch_npu": ["torch-npu"]}
SKIP_DIRS = (".git/", ".venv/", ".cache/",
             # verl's own launch scripts at the pin, kept as the import corpus: each names the commit it came from
             # (its provenance), and test_import_corpus.py holds that commit to the lock's git.verl pin
             "tests/unit/fixtures/verl_scripts/")


@pytest.fixture(scope="module")
def lock():
    return load_lock(LOCK_FILE)


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(LOCK_FILE.read_text())


def write_lock(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load(LOCK_FILE.read_text())
    mutate(data)
    path = tmp_path / "lock.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------------------------------------ the pins

def test_git_pins_are_full_commit_ids(raw):
    assert raw["git"], "no git pins"
    for name, pin in raw["git"].items():
        assert COMMIT_RE.match(str(pin["commit"])), f"git.{name}.commit = {pin['commit']!r}"


def test_pypi_pins_are_exact_versions(raw):
    for name, version in raw["pypi"].items():
        assert isinstance(version, str) and EXACT_VERSION_RE.match(version), f"pypi.{name} = {version!r}"


def test_lock_loads(lock):
    assert lock.python == "3.10"
    assert set(lock.git) >= {"vllm", "vllm-ascend", "transformers", "mindspeed", "megatron-lm", "verl"}
    assert {"torch", "torch_npu", "flash-llm-rl", "ray"} <= set(lock.pypi)


@pytest.mark.parametrize(("mutate", "field", "why"), [
    (lambda d: d["git"]["megatron-lm"].update(commit="core_v0.12.1"), "git.megatron-lm.commit", "full 40-hex"),
    (lambda d: d["git"]["verl"].update(commit="51d2104"), "git.verl.commit", "full 40-hex"),
    (lambda d: d["pypi"].update(torch=">=2.7"), "pypi", "exact version"),
    (lambda d: d["pypi"].update(ray="2.46.*"), "pypi", "exact version"),
    (lambda d: d["node_python"].update(requests=">=2.31"), "node_python", "exact version"),
    (lambda d: d["cann"]["installers"]["nnal"]["x86_64"].update(sha256="abc"), "cann.installers.nnal.x86_64.sha256",
     "64 lowercase hex"),
    (lambda d: d["base_image"].update(digest="latest"), "base_image.digest", "sha256:"),
    (lambda d: d["cann"]["installers"]["kernels"].pop("aarch64"), "cann", "installers.kernels.aarch64 is missing"),
    (lambda d: d["unpinned_deps"]["verl"].append("transformers>=4.52"), "unpinned_deps.verl", "pinned"),
    (lambda d: d.update(python=3.1), "python", "valid string"),
    (lambda d: d.update(python="3.10.12"), "python", "MAJOR.MINOR"),
    (lambda d: d["git"]["vllm"].update(url="git@github.com:vllm-project/vllm.git"), "git.vllm.url", "https://"),
    (lambda d: d.update(surprise=1), "surprise", "Extra inputs"),
])
def test_invalid_lock_names_the_field(tmp_path, mutate, field, why):
    with pytest.raises(LockError) as err:
        load_lock(write_lock(tmp_path, mutate))
    assert field in str(err.value) and why in str(err.value), str(err.value)


def with_line(after: str, line: str) -> tuple[str, int, int]:
    """The lock's text with `line` inserted after the first line starting with `after` (stripped of indentation);
    returns (text, 1-based number of that line, 1-based number of the inserted line)."""
    lines = LOCK_FILE.read_text().splitlines(keepends=True)
    index = next(i for i, ln in enumerate(lines) if ln.strip().startswith(after))
    lines.insert(index + 1, line)
    return "".join(lines), index + 1, index + 2


def test_lock_check_refuses_a_key_given_twice_naming_file_and_line(tmp_path, raw):
    """Plain YAML keeps the last of a key given twice, silently: a second `commit:` inside git.verl would pin
    another verl unseen. `rollout8 lock --check` (make lock-check) refuses the file, naming it and both lines."""
    text, first, second = with_line(f"commit: {raw['git']['verl']['commit']}", "    commit: " + "f" * 40 + "\n")
    assert text.count("\n  verl:\n") == 1 and second == first + 1
    path = tmp_path / "versions.lock.yaml"
    path.write_text(text)
    result = subprocess.run([sys.executable, "-m", "rollout8", "lock", "--lock", str(path), "--check"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:{second}: key 'commit' is given twice (first at line {first}): keep one" in result.stderr
    assert "Traceback" not in result.stderr and "valid" not in result.stdout


@pytest.mark.parametrize("key, shown", [
    ("1", "key 1 is not a string (int): quote it ('1')"),
    ("on", "key True is not a string (bool): quote it ('on')"),
    ("? [torch, ray]\n  ", "key ['torch', 'ray'] is not a string (list)"),
])
def test_a_key_that_is_not_a_string_is_refused_naming_the_line(tmp_path, key, shown):
    """`1:` or `on:` would be a number or a boolean key, `? [a, b]` a list: not a name; refused with its line."""
    text, _, line = with_line("torch_npu:", f"  {key}: \"9.9\"\n")
    path = tmp_path / "lock.yaml"
    path.write_text(text)
    with pytest.raises(LockError) as err:
        load_lock(path)
    assert str(err.value).startswith(f"{path}:{line}: {shown}"), str(err.value)


def test_lock_text_edits_are_read_as_strictly(tmp_path):
    """set_base_digest validates its edit with load_lock_text: the same refusal, naming the file and line."""
    from rollout8.lock import load_lock_text

    first = next(i for i, ln in enumerate(LOCK_FILE.read_text().splitlines(), 1) if ln.startswith("  torch:"))
    text, _, second = with_line("torch_npu:", '  torch: "2.8.0"\n')
    with pytest.raises(LockError, match=rf"^lock\.yaml:{second}: key 'torch' is given twice \(first at line "
                                        rf"{first}\)"):
        load_lock_text(text, "lock.yaml")


def test_a_lock_that_is_not_utf8_or_not_yaml_is_refused_in_one_line(tmp_path):
    path = tmp_path / "lock.yaml"
    path.write_bytes(LOCK_FILE.read_bytes().replace(b"ubuntu", b"ub\xffntu", 1))
    with pytest.raises(LockError, match=rf"^{path}: not UTF-8 text \(byte \d+\); save the version lock as UTF-8$"):
        load_lock(path)
    text, _, _ = with_line("torch_npu:", "  ray: [2.46\n")
    path.write_text(text)
    with pytest.raises(LockError) as err:
        load_lock(path)
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{path}:"), str(err.value)
    assert "not valid YAML" in str(err.value)


def test_cli_fails_loudly_on_a_placeholder(tmp_path):
    path = write_lock(tmp_path, lambda d: d["git"]["megatron-lm"].update(commit="TODO-resolve-core_v0.12.1"))
    result = subprocess.run([sys.executable, "-m", "rollout8", "lock", "--lock", str(path), "--build-args"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "git.megatron-lm.commit" in result.stderr and not result.stdout


def test_digest_ignores_layout_but_not_content(tmp_path, lock):
    reformatted = tmp_path / "same.yaml"
    reformatted.write_text("# a comment\n" + yaml.safe_dump(yaml.safe_load(LOCK_FILE.read_text()), sort_keys=True))
    assert load_lock(reformatted).digest() == lock.digest()
    changed = write_lock(tmp_path, lambda d: d["pypi"].update(ray="2.47.1"))
    assert load_lock(changed).digest() != lock.digest()
    assert load_lock(changed).image_ref() != lock.image_ref()


# ------------------------------------------------------------------------------------ written only once

def repo_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk it
        out = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    files = []
    for rel in out:
        if rel == "versions.lock.yaml" or rel.startswith(SKIP_DIRS) or "/__pycache__/" in rel:
            continue
        path = ROOT / rel
        if path.is_file():
            files.append(path)
    return files


def pin_patterns(lock) -> dict[str, re.Pattern]:
    """What a hard-coded pin looks like: the full commit id; a requirement or assignment of a pinned version;
    a CANN installer file name; the SoC version as a value."""
    pats: dict[str, re.Pattern] = {}
    for name, pin in lock.git.items():
        pats[f"git.{name}.commit"] = re.compile(re.escape(pin.commit))
    for section, name, version in [*(("pypi", n, v) for n, v in lock.pypi.items()),
                                   *(("node_python", n, v) for n, v in lock.node_python.items())]:
        names = {name, normalize(name), normalize(name).replace("-", "_"), *ALIASES.get(name, [])}
        alt = "|".join(sorted(re.escape(n) for n in names))
        v = re.escape(version)
        pats[f"{section}.{name}"] = re.compile(
            rf"(?i)(?:\b(?:{alt})\s*(?:===?|~=|>=)\s*{v}(?![\w.])"  # torch==X.Y.Z
            rf"|\b(?:{alt})[\w]*version\w*\s*[:=]\s*[\"']?{v}(?![\w.]))"  # FLASHRL_VERSION = "X.Y.Z"
        )
    for kind, arches in lock.cann.installers.items():
        for arch, inst in arches.items():
            pats[f"cann.installers.{kind}.{arch}.file"] = re.compile(re.escape(inst.file))
    pats["cann.version"] = re.compile(rf"(?i)CANN_VERSION\s*[:=]\s*[\"']?{re.escape(lock.cann.version)}")
    pats["soc_version"] = re.compile(rf"SOC_VERSION\s*[:=]\s*[\"']?{re.escape(lock.soc_version)}")
    return pats


def test_node_python_requirements_are_the_locks_pins(lock):
    """`rollout8 lock --node-python` (what make node-wheels downloads): one exact requirement per node_python pin,
    requests among them (the community.docker modules' one need on a node)."""
    lines = lock.node_python_requirements().splitlines()
    assert sorted(lines) == sorted(f"{normalize(n)}=={v}" for n, v in lock.node_python.items())
    assert any(line.startswith("requests==") for line in lines)


def test_no_pin_hard_coded_elsewhere(lock):
    pats = pin_patterns(lock)
    hits = []
    scanned = 0
    for path in repo_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        scanned += 1
        rel = path.relative_to(ROOT)
        if str(rel) == "README.md" and README_BEGIN in text:
            start, end = text.find(README_BEGIN), text.find(README_END)
            text = text[:start] + text[end:]  # the generated block, checked for equality below
        for field, pat in pats.items():
            for m in pat.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                hits.append(f"{rel}:{line}: {field} ({m.group(0)!r})")
    assert scanned > 20, f"scanned only {scanned} files: the file listing is broken"
    assert not hits, ("pins are written only in versions.lock.yaml; read them with rollout8.lock.load_lock() or "
                      "`rollout8 lock --get KEY`, and refer to them in prose by name (e.g. 'the git.verl pin'):\n"
                      + "\n".join(hits))


def test_hard_coded_detector_catches_each_kind(lock, tmp_path):
    """The detector itself: each kind of hard-coded pin is found (so the test above can fail)."""
    pats = pin_patterns(lock)
    samples = {
        "git.verl.commit": f"git checkout {lock.git['verl'].commit}",
        "pypi.torch": f"pip install torch=={lock.pypi['torch']}",
        "pypi.torch_npu": f"TORCH_NPU_VERSION={lock.pypi['torch_npu']}",
        "pypi.flash-llm-rl": f'FLASHRL_VERSION = "{lock.pypi["flash-llm-rl"]}"',
        "cann.installers.toolkit.x86_64.file": lock.cann.installers["toolkit"]["x86_64"].file,
        "soc_version": f"SOC_VERSION={lock.soc_version}",
    }
    for field, sample in samples.items():
        assert pats[field].search(sample), (field, sample)
    assert not pats["pypi.torch"].search(f"torch=={lock.pypi['torch']}.dev20250724 is a vendor build")


def test_readme_table_is_generated(lock):
    text = (ROOT / "README.md").read_text()
    assert readme_block(text) == format_markdown(lock), "README version table is stale: run `make versions-table`"


# ---------------------------------------------------------------------------- Dockerfile and Makefile agree

def dockerfile_args() -> dict[str, str | None]:
    args: dict[str, str | None] = {}
    for m in re.finditer(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?\s*$", DOCKERFILE.read_text(), re.MULTILINE):
        name, default = m.group(1), m.group(2)
        if default is not None or name not in args:
            args[name] = default
    return args


def test_dockerfile_declares_every_lock_arg_without_default(lock):
    declared = dockerfile_args()
    lock_args = lock.build_args()
    missing = sorted(set(lock_args) - set(declared))
    assert not missing, f"docker/Dockerfile lacks ARG {missing}"
    with_default = sorted(k for k in lock_args if declared.get(k) is not None)
    assert not with_default, f"pins must not have defaults in docker/Dockerfile: {with_default}"
    unknown = sorted(set(declared) - set(lock_args) - NON_PIN_ARGS)
    assert not unknown, f"docker/Dockerfile ARGs neither from the lock nor known knobs: {unknown}"


def test_dockerfile_labels_every_pin(lock):
    text = DOCKERFILE.read_text()
    labels = dict(re.findall(r"(io\.rollout8\.pin\.[\w.-]+)=\"\$\{(\w+)\}\"", text))
    args = lock.build_args()
    for name in [*lock.pypi, *lock.git]:
        key = f"io.rollout8.pin.{name}"
        assert key in labels, f"no label {key}"
        value = args[labels[key]]
        assert value in (lock.pypi.get(name), getattr(lock.git.get(name), "commit", None)), (key, value)
    assert labels["io.rollout8.pin.base-image"] == "UBUNTU_IMAGE"
    assert "io.rollout8.lock.digest" in text


def make_dry_run(target: str, **variables: str) -> list[str]:
    cmd = ["make", "-n", "-C", str(ROOT), target, f"PYTHON={sys.executable}"]
    cmd += [f"{k}={v}" for k, v in variables.items()]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_make_image_is_one_docker_build_with_the_lock_args(lock):
    lines = make_dry_run("image")
    builds = [ln for ln in lines if re.search(r"\bdocker build\b", ln)]
    assert len(builds) == 1, lines
    argv = shlex.split(builds[0])
    given = {}
    for i, tok in enumerate(argv):
        if tok.startswith("--build-arg="):
            key, _, value = tok.removeprefix("--build-arg=").partition("=")
            given[key] = value
        elif tok == "--build-arg":
            key, _, value = argv[i + 1].partition("=")
            given[key] = value
    labels = {k: given.pop(k) for k in ("ROLLOUT8_VERSION", "ROLLOUT8_REVISION", "ROLLOUT8_SOURCE", "ROLLOUT8_CREATED")}
    assert given == lock.build_args()
    from rollout8 import __version__

    assert labels["ROLLOUT8_VERSION"] == __version__ and labels["ROLLOUT8_CREATED"]
    assert argv[argv.index("-t") + 1] == lock.image_ref()
    assert argv[argv.index("-f") + 1] == "docker/Dockerfile"


def test_make_image_knobs_are_not_pins(lock):
    build = [ln for ln in make_dry_run("image", ENGINE="podman", CA_BUNDLE="/etc/ssl/certs/ca.crt",
                                        BASE_IMAGE="registry.local/cann:8", PIP_INDEX_URL="https://mirror/simple")
             if " build -f " in ln]
    argv = shlex.split(build[0])
    assert "--secret" in argv and argv[argv.index("--secret") + 1] == "id=ca_bundle,src=/etc/ssl/certs/ca.crt"
    assert "--build-arg=BASE_IMAGE=registry.local/cann:8" in argv
    assert "--build-arg=PIP_INDEX_URL=https://mirror/simple" in argv
    assert argv[argv.index("--format") + 1] == "docker"  # podman: keep SHELL and labels (OCI format drops SHELL)


def test_make_image_save_writes_the_lock_image_with_checksum_and_metadata(lock):
    lines = make_dry_run("image-save")
    ref = lock.image_ref()
    tarball = f"out/{ref.replace('/', '_').replace(':', '_')}.tar.gz"
    assert f"bash scripts/image-save.sh {ref} {tarball} docker" in lines, lines
    script = (ROOT / "scripts" / "image-save.sh").read_text()
    assert "gzip -1" in script and "sha256sum" in script and '"architecture": "{{.Architecture}}"' in script


def test_inventory_sample_and_role_default_name_the_lock_image(lock):
    """`make image` tags lock.image_ref(); the sample inventory and the roles' default must name the same image
    (the documented tarball path failed in the image role when they said rollout8:latest)."""
    sample = yaml.safe_load((ROOT / "ansible/inventory/sample/group_vars/all/runtime.yml").read_text())
    assert sample["rollout8_image"] == lock.image_ref(), (
        f"set rollout8_image in ansible/inventory/sample/group_vars/all/runtime.yml to {lock.image_ref()} "
        "(`rollout8 lock --get image`)")
    defaults = yaml.safe_load((ROOT / "ansible/roles/rollout8_defaults/defaults/main.yml").read_text())
    assert defaults["rollout8_image"] == ""  # the knob: empty means the plan's image
    derived = yaml.safe_load((ROOT / "ansible/roles/rollout8_defaults/vars/main.yml").read_text())
    assert derived["rollout8_image_ref"] == "{{ rollout8_image or rollout8_plan.image }}"  # the plan: lock.image_ref()


def test_cann_files_report(tmp_path):
    """`rollout8 lock --cann-files`: absent files are fine, an unverified or wrong one is reported with its sha256."""
    import hashlib

    from rollout8.lock import cann_report

    lock = load_lock(LOCK_FILE)
    text, ok = cann_report(lock, tmp_path)
    assert ok and text.count("absent") == 6
    inst = lock.cann.installers["toolkit"]["x86_64"]
    (tmp_path / inst.file).write_bytes(b"not really CANN")
    sha = hashlib.sha256(b"not really CANN").hexdigest()
    empty = write_lock(tmp_path, lambda d: d["cann"]["installers"]["toolkit"]["x86_64"].update(sha256=""))
    text, ok = cann_report(load_lock(empty), tmp_path)
    assert not ok and sha in text and "put it in the lock (cann.installers.toolkit.x86_64)" in text
    wrong = write_lock(tmp_path, lambda d: d["cann"]["installers"]["toolkit"]["x86_64"].update(sha256="0" * 64))
    text, ok = cann_report(load_lock(wrong), tmp_path)
    assert not ok and "DIFFERS" in text
    right = write_lock(tmp_path, lambda d: d["cann"]["installers"]["toolkit"]["x86_64"].update(sha256=sha))
    text, ok = cann_report(load_lock(right), tmp_path)
    assert ok and "sha256 verified" in text
