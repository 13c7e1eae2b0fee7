"""The simulated cluster: three Debian bookworm containers on a user-defined Docker network.

`python virtual/simcluster.py up` (what `make demo` runs) builds, each step cached by content:
1. the base image rollout8/bookworm-base:1 (scripts/make-base-image.sh: debootstrap + docker import);
2. the wheelhouse and the rollout8 wheel (scripts/build-wheelhouse.sh, into .cache/wheelhouse);
3. the node image rollout8/sim-node:<wheelhouse key>: the base with a virtualenv at /opt/rollout8/venv filled
   from the wheelhouse with `pip install --no-index --find-links`, in a container with --network none (the
   air-gapped path, for real). The rollout8 wheel itself is installed by Ansible's runtime role;
4. the network and the containers (rollout8-sim-head, -w1, -w2), idempotently.
`down` removes containers and network. `wheel` prints the bundle wheel's path. `demo` is `make demo`:
`up`, then the shipped configs/runs/tiny-cpu.yaml through ansible/train.yml, then the verdict line.
"""

from __future__ import annotations

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
BASE_IMAGE = "rollout8/bookworm-base:1"
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


def node_image(house: Path) -> str:
    image = f"rollout8/sim-node:{house.name}"
    if docker_ok("image", "inspect", image):
        print(f">> node image {image} already built", file=sys.stderr)
        return image
    sh("bash", "scripts/make-base-image.sh")  # cached; every caller (demo, tests, bench) gets it, whatever the order
    print(f">> node image {image}: offline install from {house} (about a minute)", file=sys.stderr)
    builder = f"rollout8-sim-build-{house.name}"
    sh("docker", "rm", "-f", builder, check=False, capture=True)
    script = ("set -e; python3 -m venv /opt/rollout8/venv; P=/opt/rollout8/venv/bin/pip; "
              "$P install -q --no-index --find-links /wheelhouse -r /wheelhouse/requirements.txt; "
              "$P install -q --no-index --no-deps --find-links /wheelhouse -r /wheelhouse/requirements-nodeps.txt; "
              "rm -rf /root/.cache/pip")
    sh("docker", "run", "--name", builder, "--network", "none", "-v", f"{house.resolve()}:/wheelhouse:ro",
       BASE_IMAGE, "bash", "-c", script)
    sh("docker", "commit", "-c", 'CMD ["sleep", "infinity"]', builder, image, capture=True)
    sh("docker", "rm", builder, capture=True)
    return image


def train_image(wheel: Path) -> str:
    """The docker-runtime training image of the tests: the node image plus the bundle wheel (offline install)."""
    import hashlib

    base = node_image(wheelhouse())
    key = hashlib.sha256(wheel.read_bytes()).hexdigest()[:12]
    image = f"rollout8/sim-train:{key}"
    if docker_ok("image", "inspect", image):
        return image
    builder = f"rollout8-sim-train-build-{key}"
    sh("docker", "rm", "-f", builder, check=False, capture=True)
    sh("docker", "run", "--name", builder, "--network", "none", "-v", f"{wheel.resolve()}:/tmp/{wheel.name}:ro", base,
       "/opt/rollout8/venv/bin/pip", "install", "-q", "--no-index", "--no-deps", f"/tmp/{wheel.name}", capture=True)
    sh("docker", "commit", "-c", 'CMD ["sleep", "infinity"]', builder, image, capture=True)
    sh("docker", "rm", builder, capture=True)
    return image


def up() -> str:
    image = node_image(wheelhouse())
    if not docker_ok("network", "inspect", NETWORK):
        sh("docker", "network", "create", "--label", LABEL, NETWORK, capture=True)
    for name in NODES:
        state = sh("docker", "inspect", "-f", "{{.State.Running}} {{.Config.Image}}", name, check=False, capture=True)
        if state.returncode == 0 and state.stdout.split()[1] == image:
            if state.stdout.split()[0] != "true":
                sh("docker", "start", name, capture=True)
            continue
        sh("docker", "rm", "-f", name, check=False, capture=True)
        sh("docker", "run", "-d", "--name", name, "--hostname", name, "--network", NETWORK, "--label", LABEL,
           "--init", "--shm-size", "512m", image, "sleep", "infinity", capture=True)
    print(f">> simulated cluster up: {', '.join(NODES)} (inventory {INVENTORY.relative_to(REPO)})", file=sys.stderr)
    return image


SHIPPED_SPEC = REPO / "configs" / "runs" / "tiny-cpu.yaml"


def _build_artifacts(models: Path, data: Path) -> None:
    """The tiny Qwen2 pair (`rollout8 make-test-model`) and verl-format parquet data (`rollout8 make-test-data`),
    each built once; the profile is the Ansible plan role's job."""
    cli = str(REPO / ".venv" / "bin" / "rollout8")
    if not (models / "int8" / "config.json").is_file():
        sh(cli, "make-test-model", "-o", str(models), capture=True)
    if not all((data / f"{split}.parquet").is_file() for split in ("train", "val")):
        sh(cli, "make-test-data", "-o", str(data), capture=True)


def prepare_run(work: Path) -> Path:
    """The tests' run spec: configs/runs/tiny-cpu.yaml (the shipped demo spec, so what is tested is what ships)
    with its own name, deploy root and artifacts under work/, so tests never touch the demo's out/ dir."""

    work.mkdir(parents=True, exist_ok=True)
    _build_artifacts(work / "tiny", work / "data")
    spec = yaml.safe_load(SHIPPED_SPEC.read_text())
    spec["name"] = "tiny-cpu-sim"
    spec["model"].update(bf16="tiny/bf16", int8="tiny/int8", profile="tiny/profile.pt")
    spec["data"] = {"train": "data/train.parquet", "val": "data/val.parquet"}
    spec["deploy"]["root"] = "/var/lib/rollout8/runs/tiny-cpu-sim"
    spec["verl"]["trainer.experiment_name"] = "tiny-cpu-sim"
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


def verdict_line(work: Path) -> str | None:
    """The smoke job's verdict line from the logs the collect step fetched into work/logs/<host>/."""
    found = None
    for log in sorted((work / "logs").glob("*/driver.log")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("smoke-job: verdict"):
                found = line
    return found


def demo(*playbook_args: str) -> int:
    """`make demo`: the cluster up, the shipped tiny-cpu spec through ansible/train.yml, the verdict."""
    DEMO_WORK.mkdir(parents=True, exist_ok=True)
    up()
    spec = demo_spec()
    run = run_playbook(INVENTORY, spec, DEMO_WORK, DEMO_WORK / "facts", bundle_wheel(), *playbook_args,
                       timeout=3600, stream=True)
    if run.rc != 0:
        print(f"demo: ansible-playbook train.yml failed (exit {run.rc}); its output is in "
              f"{(DEMO_WORK / 'last-playbook.log').relative_to(REPO)}", file=sys.stderr)
        return run.rc
    line = verdict_line(DEMO_WORK)
    if line is None:
        print(f"demo: the play passed but no verdict line was collected under {DEMO_WORK / 'logs'}", file=sys.stderr)
        return 1
    print(f"verdict: {line}")
    print("the cluster stays up (docker ps --filter label=rollout8.sim=1); remove it with: make demo-down")
    return 0


USAGE = "usage: simcluster.py up|down|wheel|demo [ansible-playbook args]"

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
    else:
        raise SystemExit(USAGE)
