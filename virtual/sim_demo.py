"""`make demo` and `make demo-compare`: the simulated cluster trains, and the verdict is printed.

What this module owns: `demo` (the cluster up, the shipped tiny-cpu spec through ansible/train.yml, then the
job's verdict), `compare` (the same spec with int8 and with bf16 rollouts, then one `rollout8 report`), where the
demo keeps its work (.cache/cluster/demo) and how a collected job is read back: the newest job's logs, its kind,
the probe job's verdict (through the package's one parser, `rollout8.node.probe_job.read_verdict`) and a verl
job's int8 verdict per rank (`rollout8 logs`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import sim_registry
import yaml
from sim_images import BUILDER, REPO, free_gb, sh, train_image, train_tarball
from sim_nodes import (
    INVENTORY,
    NETWORK,
    NODES,
    SHARED_HOST,
    controller_venv,
    own_export,
    prerequisites,
    run_playbook,
    up,
)
from sim_runs import bf16_twin, clear_demo_runs, demo_spec

DEMO_WORK = REPO / ".cache" / "cluster" / "demo"
CONTAINER = "rollout8-train"  # the runtime role's default name for the training container
# `make image-save` writes the training image's tarball where the nodes' shared directory is (this machine mounts
# the shared storage, as a cluster's login node often does): the image role finds it in
# <cluster.shared_dir>/.rollout8-images complete, and the controller's link carries nothing more.
IMAGE_DIR = SHARED_HOST / ".rollout8-images"


# How the demo's training image reaches the nodes (virtual/README.md, docs/benchmarks.md): "tarball" (make
# image-save, the shared directory, docker load on every node), "registry" (pushed once to the controller's registry,
# pulled by every node), "auto" (sim_registry.choose_path: the registry where the nodes hold an earlier version, the
# tarball where they hold none).
IMAGE_PATH_ENV = "ROLLOUT8_SIM_IMAGE_PATH"


def image_args(spec: Path | None = None, registry: bool = False) -> tuple[str, ...]:
    """ansible-playbook arguments naming the training image (built by `make image`'s own stages on the CPU stand-in
    stack), as users give it: `make image-save`'s tarball, which the image role sends once to the shared directory
    and every node loads (and removes once all have), or the image in the controller's registry, which every node
    pulls (ROLLOUT8_SIM_IMAGE_PATH). When every node's daemon already has the image, nothing is saved or pushed: the
    play gets the image's id, checks it on every node and loads nothing. A run spec without cluster.shared_dir has
    the tarball staged on each node that loads it (here: on this machine's disk too). The registry only with
    registry=True (make demo, make demo-compare: they stop it and tag the pulled image by its plain name once it
    is on the nodes, after_image); the cluster tests' plays always get the tarball."""
    image = train_image()
    image_id = sh(BUILDER, "image", "inspect", "-f", "{{.Id}}", image, capture=True).stdout.strip()
    image_id = image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"
    host = f"{sim_registry.gateway(NETWORK)}:{sim_registry.PORT}"  # where the registry listens, if it is used
    pulled = f"{host}/{image}"
    # a stopped node loads nothing: the play finds it unreachable and stops before the image role (a test stops
    # one on purpose); counted, it had a 7 GB tarball saved and the disk judged for a load that never comes
    up = [name for name in NODES if sh("docker", "inspect", "-f", "{{.State.Running}}", name, check=False,
                                       capture=True).stdout.strip() == "true"]
    down = sorted(set(NODES) - set(up))
    for ref in (image, pulled):
        have = [node_image_id(name, ref) for name in up]
        if all(node_id == image_id for node_id in have):
            print(f">> every running node has {ref} ({image_id[:19]}): nothing to send"
                  + (f" ({', '.join(down)} not running)" if down else ""), file=sys.stderr)
            return ("-e", f"rollout8_image={ref}", "-e", f"rollout8_image_id={image_id}")
    earlier = [name for name in up if holds_earlier(name, image)]
    requested = os.environ.get(IMAGE_PATH_ENV, "auto") if registry else "tarball"
    path = sim_registry.choose_path(requested, nodes_hold_earlier=bool(earlier))
    print(f">> the training image goes to the nodes by {path} ({IMAGE_PATH_ENV}={requested}; an earlier version on: "
          f"{', '.join(earlier) or 'none'})", file=sys.stderr)
    if path == "registry":
        drop_superseded(image, keep_prefix=f"{host}/")  # the layers of an earlier pull are what makes this one small
        address, _, port = host.rpartition(":")
        host, ca = sim_registry.start(address, int(port))
        seconds, how = sim_registry.push(image, pulled, ca, BUILDER, sim_registry.REGISTRY_DIR / "stage")
        pushed_id = sim_registry.manifest_config_digest(pulled, ca)
        if pushed_id != image_id:
            raise SystemExit(f"rollout8: the registry holds {pulled} as {pushed_id}, the builder has {image_id}")
        removed = sim_registry.prune(pulled, ca)
        print(f">> pushed {pulled} ({how}, {seconds:.0f} s){'; removed from the registry: ' if removed else ''}"
              f"{', '.join(removed)}", file=sys.stderr)
        # an update's pulls are MBs; pulls of every layer are bounded by the disk as loads are
        size = int(sh(BUILDER, "image", "inspect", "-f", "{{.Size}}", image, capture=True).stdout.strip()) / 1e9
        throttle = 0 if how == "direct" else throttle_for(size, len(up), name=pulled)
        return ("-e", f"rollout8_image={pulled}", "-e", f"rollout8_image_id={image_id}",
                "-e", "rollout8_image_tarball=", "-e", f"rollout8_image_registry_ca={ca}",
                "-e", f"rollout8_image_load_throttle={throttle}")
    have = [node_image_id(name, image) for name in up]
    drop_superseded(image)
    tarball = train_tarball(image, IMAGE_DIR)
    own_export()  # saved as this machine's root: the login user's, as a user's `make image-save` leaves it
    loads = sum(node_id != image_id for node_id in have)
    shared = spec is None or bool((yaml.safe_load(spec.read_text()).get("cluster") or {}).get("shared_dir"))
    throttle = load_throttle(tarball, loads, staged=0 if shared else loads)
    return ("-e", f"rollout8_image={image}", "-e", f"rollout8_image_tarball={tarball}",
            "-e", f"rollout8_image_load_throttle={throttle}")


def node_image_id(name: str, ref: str) -> str:
    return sh("docker", "exec", name, "docker", "image", "inspect", "-f", "{{.Id}}", ref, check=False,
              capture=True).stdout.strip()


def node_tags(name: str) -> list[str]:
    """Every repository:tag the node's daemon holds."""
    return sh("docker", "exec", name, "docker", "images", "--format", "{{.Repository}}:{{.Tag}}", check=False,
              capture=True).stdout.split()


def holds_earlier(name: str, image: str) -> bool:
    """Whether the node holds an earlier version of image (another tag of its repository, loaded or pulled): an
    update. Its daemon knows the registry's layers it pulled before (a pull sends only the others); layers it loaded
    from a tarball it does not know by their registry digest, so its first pull sends every layer again."""
    tags = node_tags(name)
    return any(is_earlier(tag, image) for tag in tags)


def is_earlier(tag: str, image: str) -> bool:
    """Whether a node's tag is another version of image: its repository, loaded (rollout8/sim-train:KEY) or pulled
    (HOST:PORT/rollout8/sim-train:KEY), another key."""
    repo, _, key = image.rpartition(":")
    tag_repo, _, tag_key = tag.rpartition(":")
    return (tag_repo == repo or tag_repo.endswith(f"/{repo}")) and tag_key != key


def drop_pulled_superseded(ref: str, keep: tuple[str, ...]) -> None:
    """After a pull: each node's other versions of ref's image (an earlier pull, an earlier load), once the play
    has moved the training container to ref (an image a container still uses stays: docker refuses)."""
    image = ref.split("/", 1)[1]
    for name in NODES:
        tags = node_tags(name)
        old = [tag for tag in tags if is_earlier(tag, image) and tag not in keep]
        if old:
            sh("docker", "exec", name, "docker", "rmi", *old, check=False, capture=True)


def drop_superseded(image: str, keep_prefix: str = "") -> None:
    """Each node's training images of other content keys, and a training container running one, before a new
    image is loaded: the runtime role would replace that container anyway, and the three nodes' daemons share this
    machine's disk (7 GB per node and image). The demo's own doing, not the image role's: on a real cluster a
    node's older images are its operators' to keep or remove."""
    repo = image.rsplit(":", 1)[0]
    for name in NODES:
        tags = node_tags(name)
        old = [tag for tag in tags if tag.rsplit(":", 1)[0].endswith(repo) and not tag.endswith(image)
               and not (keep_prefix and tag.startswith(keep_prefix))]
        if old:
            sh("docker", "exec", name, "docker", "rm", "-f", CONTAINER, check=False, capture=True)
            sh("docker", "exec", name, "docker", "rmi", *old, check=False, capture=True)
            print(f">> {name}: removed the superseded {', '.join(old)} (and its training container)", file=sys.stderr)


def load_throttle(tarball: Path, loads: int, staged: int = 0) -> int:
    """How many nodes load the image at once. The three nodes' Docker data share this machine's one disk, and a
    `docker load` unpacks the whole tarball before it registers the layers (twice the image at peak): as many at
    once as the disk has room for, after the `staged` copies of the tarball the nodes keep until every load has
    ended (a spec without a shared directory stages one per node; uncounted, three loads beside three copies ran
    out of disk: "Detected no loaded images"). Side by side on this machine three loads took 135 s, one after
    another 243 s (each load is CPU-bound in one dockerd: checksums, tar, the kernel's copies)."""
    return throttle_for(tarball.stat().st_size / 1e9, loads, staged, tarball.name)


def throttle_for(size: float, loads: int, staged: int = 0, name: str = "the image") -> int:
    """load_throttle for an image of size GB (a pull from the registry holds the downloaded layer and the layer
    unpacked from it at its peak, as a load does: the same bound)."""
    room = free_gb(str(IMAGE_DIR)) - 2 - staged * size  # a margin for what the nodes write meanwhile
    if room < 2 * size:
        raise SystemExit(f"rollout8: the simulated nodes share this machine's disk: {staged} staged copies of "
                         f"{name} ({size:.1f} GB each) and one load (about {2 * size:.0f} GB) need "
                         f"{staged * size + 2 * size + 2:.0f} GB free under {IMAGE_DIR}, only "
                         f"{free_gb(str(IMAGE_DIR)):.1f} GB are: free disk space (`docker image prune`, old clones' "
                         ".cache) and re-run")
    return max(1, min(max(loads, 1), int(room // (2 * size))))


def cluster_and_image() -> None:
    """The nodes up, the training image built and the controller's environment made, side by side once the base and
    the wheelhouse are there: the node image (Debian's Docker packages: the network), the nodes' boot and the
    controller venv (PyPI: the network) beside the stack's offline install (the disk and the cores), about two
    minutes saved on a fresh machine."""
    prerequisites()
    with ThreadPoolExecutor(max_workers=2) as pool:
        building = pool.submit(train_image)
        controller = pool.submit(controller_venv)
        up()
        controller.result()
        building.result()


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


def forget_a_run_the_nodes_do_not_know(spec: Path) -> None:
    """The demo's run starts anew where its nodes hold no record of its job (new nodes, or nodes that reset.yml
    emptied) while the shared directory still holds its checkpoints at the last step: resumed there, it would be
    refused with nothing left to train. The demo's runs only (clear_demo_runs); a run the head knows is kept, and
    the demo then reads its verdict again."""
    name = re.escape(yaml.safe_load(spec.read_text())["name"])
    listed = sh("docker", "exec", NODES[0], "ls", "/opt/rollout8/run", check=False, capture=True).stdout.split()
    if not any(re.fullmatch(rf"job-rollout8-{name}-[0-9a-f]{{12}}-verl(-\w+)?\.txt", entry) for entry in listed):
        clear_demo_runs()


def finished_under_an_earlier_version(output: str, name: str) -> bool:
    """Whether train.yml refused the demo's run `name` because its checkpoints already hold its last step: the run
    finished under an earlier version of the demo (another image or spec, so another plan the head has no record
    of), and launch refused it with nothing submitted (roles/launch, "Something is left to train")."""
    said = " ".join(output.split())
    return bool(re.search(rf"run {re.escape(name)}: its latest checkpoint is step \d+ \(.*\), at or past "
                          r"trainer\.total_training_steps \d+: .* Nothing was submitted\.", said))


def after_image(runtime: tuple[str, ...]) -> None:
    """Once train.yml has put the image on every node: a pulled image's superseded tags removed from the nodes (its
    layers stay with the new one, which the next update's pull builds on), and the controller's registry stopped
    (its storage stays in .cache/registry: the next push sends only new layers). Nothing for a tarball."""
    given = dict(arg.split("=", 1) for arg in runtime if "=" in arg)
    if given.get("rollout8_image_registry_ca"):
        ref = given["rollout8_image"]
        plain = ref.split("/", 1)[1]  # the name the tarball path leaves, which the cluster tests and plays name
        drop_pulled_superseded(ref, keep=(ref, plain))
        for name in NODES:
            sh("docker", "exec", name, "docker", "tag", ref, plain, check=False, capture=True)
    sim_registry.stop()


def demo(*playbook_args: str) -> int:
    """`make demo`: the cluster up, the shipped tiny-cpu spec through ansible/train.yml, the verdict."""
    DEMO_WORK.mkdir(parents=True, exist_ok=True)
    cluster_and_image()
    try:
        runtime = image_args(registry=True)
        return _demo(runtime, *playbook_args)
    finally:
        sim_registry.stop()  # when it was started; a no-op otherwise


def _demo(runtime: tuple[str, ...], *playbook_args: str) -> int:
    spec = demo_spec()
    forget_a_run_the_nodes_do_not_know(spec)
    name = yaml.safe_load(spec.read_text())["name"]
    controller = controller_venv()  # as a jump host: ansible-core and the rollout8 CLI, no torch, no models
    # As on a real cluster: train.yml returns once the job runs (a verl job: its first step logged); the verify
    # play, run later from another shell, shows where it stands; here it follows the job to its final verdict.
    for step, args in (("train.yml", ()), ("train.yml --tags verify", ("--tags", "verify", "-e",
                                                                       "rollout8_verify_follow=true"))):
        play = partial(run_playbook, INVENTORY, spec, DEMO_WORK, DEMO_WORK / "facts", *runtime, *args,
                       *playbook_args, timeout=3600, stream=True, controller=controller)
        run = play()
        if step == "train.yml" and run.rc != 0 and finished_under_an_earlier_version(run.output, name):
            # the demo's own run, finished by an earlier version of this checkout (`git pull`, then `make demo`
            # on the same cluster): its checkpoints hold nothing left to train. It starts anew, once; a user's
            # runs on the shared directory are never touched (clear_demo_runs).
            print(f">> the demo's run {name} trained all its steps under an earlier version of the demo: starting it "
                  "anew (its checkpoints on the shared directory removed)", file=sys.stderr)
            clear_demo_runs()
            run = play()
        if run.rc != 0:
            print(f"demo: ansible-playbook {step} failed (exit {run.rc}); its output is in "
                  f"{(DEMO_WORK / 'last-playbook.log').relative_to(REPO)}", file=sys.stderr)
            return run.rc
        if step == "train.yml":
            after_image(runtime)
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


def run_jobs(specs: list[tuple[str, Path]], *playbook_args: str) -> dict[str, tuple[Path, Path]] | int:
    """Each (label, run spec) through train.yml on the demo's cluster, one after the other: {label: (job logs,
    plan)}, or the exit code of the first run that failed."""
    DEMO_WORK.mkdir(parents=True, exist_ok=True)
    cluster_and_image()
    try:
        return _run_jobs(image_args(registry=True), specs, *playbook_args)
    finally:
        sim_registry.stop()


def _run_jobs(runtime: tuple[str, ...], specs: list[tuple[str, Path]],
              *playbook_args: str) -> dict[str, tuple[Path, Path]] | int:
    jobs = {}
    for label, spec in specs:
        print(f">> {label} run: {spec.relative_to(REPO)} through ansible/train.yml", file=sys.stderr)
        run = run_playbook(INVENTORY, spec, DEMO_WORK, DEMO_WORK / "facts", *runtime,
                           "-e", "rollout8_job_kind=verl", "-e", "rollout8_verify_follow=true", *playbook_args,
                           timeout=3600, stream=True, controller=controller_venv())
        if run.rc != 0:
            print(f"demo-compare: the {label} run failed (exit {run.rc}); see {DEMO_WORK / 'last-playbook.log'}",
                  file=sys.stderr)
            return run.rc
        after_image(runtime)
        jobs[label] = (latest_job_logs(DEMO_WORK), DEMO_WORK / spec.stem / "rollout8-plan.json")
    return jobs


def compare(*playbook_args: str) -> int:
    """`make demo-compare`: the demo's int8 run and its bf16 twin through train.yml, then `rollout8 report`."""
    jobs = run_jobs([("int8", demo_spec()), ("bf16", bf16_twin(demo_spec(), DEMO_WORK))], *playbook_args)
    if isinstance(jobs, int):
        return jobs
    out = DEMO_WORK / "compare"
    cli = str(REPO / ".venv" / "bin" / "rollout8")
    args = [cli, "report", str(jobs["bf16"][0]), str(jobs["int8"][0]), "--config", str(jobs["bf16"][1]),
            "--config", str(jobs["int8"][1]), "--label", "bf16", "--label", "int8", "-o", str(out),
            "--title", "tiny-cpu on the simulated cluster: int8 (FlashRL) vs bf16 rollouts"]
    proc = subprocess.run(args, text=True, timeout=600)
    if proc.returncode == 0:
        print(f"report: {(out / 'report.html').relative_to(REPO)}")
    return proc.returncode
