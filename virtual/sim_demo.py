"""`make demo` and `make demo-compare`: the simulated cluster trains, and the verdict is printed.

What this module owns: `demo` (the cluster up, the shipped tiny-cpu spec through ansible/train.yml, then the
job's verdict), `compare` (the same spec with int8 and with bf16 rollouts, then one `rollout8 report`), where the
demo keeps its work (.cache/cluster/demo) and how a collected job is read back: the newest job's logs, its kind,
the probe job's verdict (through the package's one parser, `rollout8.node.probe_job.read_verdict`) and a verl
job's int8 verdict per rank (`rollout8 logs`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sim_images import BUILDER, REPO, bundle_wheel, sh, train_image, train_tarball
from sim_nodes import HERE, INVENTORY, NODES, SHARED_HOST, run_playbook, up
from sim_runs import bf16_twin, demo_spec

DEMO_WORK = REPO / ".cache" / "cluster" / "demo"
# The production runtime's settings for the simulated nodes (the training container, its stand-in stack).
DOCKER_RUNTIME_VARS = HERE / "inventory" / "docker-runtime.yml"
# `make image-save` writes the training image's tarball where the nodes' shared directory is (this machine mounts
# the shared storage, as a cluster's login node often does): the image role finds it in
# <cluster.shared_dir>/.rollout8-images complete, and the controller's link carries nothing more.
IMAGE_DIR = SHARED_HOST / ".rollout8-images"


def stop_host_runtime_ray() -> None:
    """Stop a Ray the host runtime left on a node (the cluster tests run on the same nodes with it): it holds the
    ports the training containers' Ray needs, and the container cannot see it to stop it. Seen by the state the
    ray role recorded (rollout8_home/run/ray-state.json, runtime host); a node without one is left alone."""
    check = ("import json,sys; sys.exit(0 if json.load(open('/opt/rollout8/run/ray-state.json')).get('runtime')"
             " == 'host' else 1)")
    for name in NODES:
        if sh("docker", "exec", name, "python3", "-c", check, check=False, capture=True).returncode == 0:
            print(f">> {name}: stopping the host runtime's Ray (the cluster tests'); the training container runs "
                  "its own", file=sys.stderr)
            sh("docker", "exec", name, "/opt/rollout8/venv/bin/ray", "stop", "--force", check=False, capture=True)
            sh("docker", "exec", name, "rm", "-f", "/opt/rollout8/run/ray-state.json", capture=True)


def docker_runtime_args() -> tuple[str, ...]:
    """ansible-playbook arguments of the production runtime: the training image (built by `make image`'s own
    stages on the CPU stand-in stack) and the runtime's settings for these nodes. The image goes as users send it:
    `make image-save`'s tarball, which the image role sends once to the shared directory and every node loads
    (and removes once all have). When every node's daemon already has the image, nothing is saved: the play gets
    the image's id, checks it on every node and loads nothing."""
    image = train_image()
    image_id = sh(BUILDER, "image", "inspect", "-f", "{{.Id}}", image, capture=True).stdout.strip()
    image_id = image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"
    have = [sh("docker", "exec", name, "docker", "image", "inspect", "-f", "{{.Id}}", image, check=False,
               capture=True).stdout.strip() for name in NODES]
    common = ("-e", f"@{DOCKER_RUNTIME_VARS}", "-e", f"rollout8_image={image}")
    if all(node_id == image_id for node_id in have):
        print(f">> every node has {image} ({image_id[:19]}): nothing to send", file=sys.stderr)
        return (*common, "-e", f"rollout8_image_id={image_id}")
    return (*common, "-e", f"rollout8_image_tarball={train_tarball(image, IMAGE_DIR)}")


def latest_job_logs(work: Path) -> Path | None:
    """The newest job's collected logs (work/logs/<job id>/, holding driver.log and one directory per host)."""
    jobs = sorted((p.parent for p in (work / "logs").glob("*/driver.log")), key=lambda p: p.stat().st_mtime)
    return jobs[-1] if jobs else None


def job_kind(job: Path) -> str:
    """verl or probe, from the job's directory: the launch role names it <plan job id>-<kind>-<UTC timestamp>."""
    parts = job.name.rsplit("-", 2)
    return parts[1] if len(parts) == 3 else ""


def probe_verdict(job: Path) -> tuple[bool, str]:
    """(green, one line) for a collected probe job: "probe job GREEN on all N nodes" or "probe job RED on host-a,
    host-b". The driver log is read by the package's one parser of the verdict, as the verify role and the tests
    read it."""
    from rollout8.node.probe_job import judge_verdict, read_verdict  # `import simcluster` needs no rollout8

    return judge_verdict(read_verdict((job / "driver.log").read_text(errors="replace")), len(NODES))


def verl_verdict(job: Path) -> tuple[int, str]:
    """`rollout8 logs` on the collected Ray logs of a verl job: (exit code, its per-rank lines)."""
    cli = str(REPO / ".venv" / "bin" / "rollout8")
    proc = subprocess.run([cli, "logs", str(job)], capture_output=True, text=True, timeout=300)
    return proc.returncode, (proc.stdout + proc.stderr).rstrip()


def demo(*playbook_args: str) -> int:
    """`make demo`: the cluster up, the shipped tiny-cpu spec through ansible/train.yml, the verdict."""
    DEMO_WORK.mkdir(parents=True, exist_ok=True)
    up()
    stop_host_runtime_ray()
    runtime = docker_runtime_args()
    spec = demo_spec()
    # As on a real cluster: train.yml returns once the job runs (a verl job: its first step logged); the verify
    # play, run later from another shell, shows where it stands; here it follows the job to its final verdict.
    for step, args in (("train.yml", ()), ("train.yml --tags verify", ("--tags", "verify", "-e",
                                                                       "rollout8_verify_follow=true"))):
        run = run_playbook(INVENTORY, spec, DEMO_WORK, DEMO_WORK / "facts", bundle_wheel(), *runtime, *args,
                           *playbook_args, timeout=3600, stream=True)
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
    if job_kind(job) == "probe":
        green, line = probe_verdict(job)
        print(f"{line} (driver log {(job / 'driver.log').relative_to(REPO)})")
        if not green:
            return 1
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


def compare(*playbook_args: str) -> int:
    """`make demo-compare`: the demo's int8 run and its bf16 twin through train.yml, then `rollout8 report`."""
    DEMO_WORK.mkdir(parents=True, exist_ok=True)
    up()
    stop_host_runtime_ray()
    runtime = docker_runtime_args()
    jobs = {}
    for label, spec in (("int8", demo_spec()), ("bf16", bf16_twin(demo_spec(), DEMO_WORK))):
        print(f">> {label} run: {spec.relative_to(REPO)} through ansible/train.yml", file=sys.stderr)
        run = run_playbook(INVENTORY, spec, DEMO_WORK, DEMO_WORK / "facts", bundle_wheel(), *runtime,
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
