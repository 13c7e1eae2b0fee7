"""The deployment plan: what Ansible copies where, the node environment and the Ray job, from one run spec.

`rollout8 plan RUN.yaml -o DIR` runs on the controller (Ansible's plan role) and, in one process, checks the spec
(`rollout8 check`'s rules, once), renders it (`render`) and writes, into DIR:
- `flashrl.yaml`: the rendered FlashRL config with node paths (int8 and hybrid runs);
- `launch.sh`: render's launch script (the env exports and the verl command), the verl job's entrypoint;
- `rollout8-plan.json`: the plan, the `Plan` model below. Its fields:
  `node_paths` (what -> absolute node path: bf16, int8, profile, train, val, reward, flashrl, launch, plan),
  `copies` (local source -> node destination, file or directory, the list the artifacts role copies), `sha256`
  ('what/relative file' -> sha256 of the controller's copy, checked again on every node by the probe job), `env`
  (exported on every node before `ray start`: render's `build_env`, the same as `rollout8.env`), `entrypoints`
  (probe: the cluster probe job; verl: `bash <deploy root>/launch.sh`), `training_steps`
  (trainer.total_training_steps, for the verify play's one-sync-per-step check), `job_id` (a stable Ray submission
  id: the same plan gives the same id, so a re-run does not launch a finished job twice), `image` (the training
  image of this bundle's lock, `rollout8 lock --get image`, what `make image` tags: the roles' default
  rollout8_image; not part of the job's identity, since an inventory may name another), `shared_dir` and
  `checkpoint_dir` (cluster.shared_dir, proven shared by preflight; verl's checkpoints, resumed by a resubmission),
  `mounts` (with deploy.shared_storage: the artifact paths outside the deploy root and the shared directory, which
  the docker runtime mounts read-only into the training container at the same path; derived from node_paths, so
  not part of the job's identity), and what preflight sizes the checkpoints' filesystem by (checkpoint_size):
  `model_parameters` (the bf16 model's, from its safetensors headers), `max_actor_ckpt_to_keep` (as verl gets it;
  null: every checkpoint kept), `checkpoint_saves_kept` (the most on disk at once), `checkpoint_bytes_per_save`,
  `checkpoint_share` (1 with shared_dir; else the nodes that split each checkpoint's shards) and
  `checkpoint_bytes_needed` (free space needed where they land, on each node; 0: no saves, or the model not
  readable); derived from the model and launch.sh, which the identity covers, so not part of it either;
- `arrival.json`: the copies again, each with its files (node path, size, mtime, sha256): what each node's arrival
  ledger (`<deploy root>/.rollout8-arrival.json`) is checked against;
- `send/`: the deploy root as symlinks to the copies' sources, what the artifacts role's one rsync per node sends.

The same inputs always give byte-identical files, so Ansible sees no change on a re-run. Checksums are cached in
DIR/.sha256-cache.json by (path, size, mtime) so a re-run does not re-read large models.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path, PurePosixPath
from typing import Literal

from ..errors import ChecksRefused, SpecError
from ..fileutil import atomic_symlink, atomic_write, sha256_bytes, sha256_file, sha256_json
from ..lock import load_lock
from ..models import StrictModel
from ..yamlio import load_json
from . import check as check_rules
from .check_common import effective
from .checkpoint_size import checkpoint_need, model_parameters
from .flashrl_config import dump_config
from .node_path import container_mounts
from .render import FLASHRL_FILE, LAUNCH_FILE, launch_text, render
from .runspec import RunSpec, load_spec

PLAN_FILE = "rollout8-plan.json"
ARRIVAL_FILE = "arrival.json"
SEND_TREE = "send"
LEDGER_FILE = ".rollout8-arrival.json"
CACHE_FILE = ".sha256-cache.json"
PREVIEW_DIR = Path("<plan dir>")  # where a preview (plan --no-artifacts) says the generated files would be
PROFILE_CHECK_CACHE = ".profile-checks"  # check_profile's passes, by the key of their inputs
SCHEMA = 1
# the checkpoints' sizing (checkpoint_size.CheckpointNeed.plan_fields): derived from the model's bytes and the
# rendered launch.sh, both in the identity already, so a plan of an earlier bundle keeps its job id
SIZING_FIELDS = ("model_parameters", "max_actor_ckpt_to_keep", "checkpoint_saves_kept", "checkpoint_bytes_per_save",
                 "checkpoint_share", "checkpoint_bytes_needed")


class Copy(StrictModel):
    what: str
    src: str
    dest: str
    kind: Literal["file", "dir"]


class Plan(StrictModel):
    """rollout8-plan.json: what the Ansible roles and the probe job read (and nothing else)."""

    schema_: int = SCHEMA
    name: str
    accelerator: Literal["npu", "cpu"]
    nnodes: int
    npus_per_node: int
    quantization: str
    flashrl: bool
    deploy_root: str
    node_paths: dict[str, str]
    copies: list[Copy]
    sha256: dict[str, str]
    env: dict[str, str]
    entrypoints: dict[str, str]
    training_steps: int | None = None
    job_id: str = ""
    image: str = ""
    shared_dir: str | None = None
    checkpoint_dir: str | None = None
    mounts: list[str] = []
    model_parameters: int | None = None
    max_actor_ckpt_to_keep: int | None = None
    checkpoint_saves_kept: int = 0
    checkpoint_bytes_per_save: int = 0
    checkpoint_share: int = 1
    checkpoint_bytes_needed: int = 0

    def to_json(self) -> dict:
        data = self.model_dump(mode="json")
        data["schema"] = data.pop("schema_")
        return data

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        data = dict(data)
        data["schema_"] = data.pop("schema", SCHEMA)
        return cls.model_validate(data)

    def identity(self) -> str:
        """The job's identity: what runs and on which bytes (not where the controller keeps its copies)."""
        fields = {k: v for k, v in self.to_json().items() if k not in ("copies", "job_id", "image", "mounts")
                  and k not in SIZING_FIELDS}
        return sha256_json(fields)[:12]


def load_plan(path: str | Path) -> Plan:
    return Plan.from_json(load_json(Path(path).read_bytes(), source=path))


def _checksums(what: str, local: Path, cache: dict) -> dict[str, str]:
    def cached(path: Path) -> str:
        stat = path.stat()
        key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
        if key not in cache:
            cache[key] = sha256_file(path)
        return cache[key]

    if local.is_dir():
        files = sorted(p for p in local.rglob("*") if p.is_file())
        return {f"{what}/{p.relative_to(local)}": cached(p) for p in files}
    return {what: cached(local)}


def arrivals(plan: Plan) -> dict:
    """What the artifacts role sends and seals (DIR/arrival.json): the plan's copies, each with its files (node
    path, the controller's size, mtime and sha256), and the node ledger where each node records what arrived."""
    return arrival_list([c.model_dump() for c in plan.copies], plan.sha256, plan.deploy_root)


def arrival_list(copies: list[dict], sha256: dict[str, str], deploy_root: str) -> dict:
    """arrivals() for copies given as dicts (what, src, dest, kind) and sha256 keyed as the plan keys it."""
    out = []
    for copy in copies:
        if copy["kind"] == "file":
            files = [(copy["dest"], Path(copy["src"]), sha256[copy["what"]])]
        else:
            prefix = f"{copy['what']}/"
            files = [(f"{copy['dest']}/{key[len(prefix):]}", Path(copy["src"]) / key[len(prefix):], sha)
                     for key, sha in sha256.items() if key.startswith(prefix)]
        stats = [src.stat() for _, src, _ in files]
        out.append({**copy, "files": [{"path": dest, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
                                      for (dest, _, sha), st in zip(files, stats, strict=True)]})
    return {"ledger": f"{deploy_root}/{LEDGER_FILE}", "root": deploy_root, "copies": out}


def write_send_tree(tree: Path, arrival: dict) -> None:
    """DIR/send/: the node's deploy root as symlinks to the controller's copies (what -> its source), so that one
    rsync per node (following the links) sends every copy: one connection and one file list instead of one per
    copy. Rewritten only where it differs; entries of copies no longer in the plan are removed."""
    root = PurePosixPath(arrival["root"])
    want = {}
    for copy in arrival["copies"]:
        rel = PurePosixPath(copy["dest"]).relative_to(root)  # every node path is under the deploy root
        want[tree / rel] = copy["src"]
    for link, src in want.items():
        if link.is_symlink() and os.readlink(link) == src:
            continue
        atomic_symlink(link, src)
    # bottom-up, never into a link (a link to a model directory is the user's data, not the tree's)
    for top, dirs, names in os.walk(tree, topdown=False):
        for name in dirs + names:
            path = Path(top) / name
            if path.is_symlink():
                if path not in want:
                    path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()


def _refresh(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `path` (atomically) only when its text differs: an unchanged file keeps its mtime, so neither Ansible
    nor a node's arrival ledger sees a change."""
    if not path.is_file() or path.read_text() != text:
        atomic_write(path, text, mode=mode)


def refuse_check_errors(spec: RunSpec, source: str | Path, profile_cache: Path | None = None,
                        artifacts: bool = True, nic_in_inventory: bool = False) -> None:
    """`rollout8 check`'s rules, once: any error stops the plan, each finding on its own line."""
    errors = [f for f in check_rules.run_checks(spec, profile_cache, artifacts, nic_in_inventory)
              if f.level == "error"]
    if errors:
        lines = "\n".join(f.line() for f in errors)
        raise ChecksRefused(f"rollout8 check {source} failed: {len(errors)} error(s)\n{lines}")


def build_plan(spec_path: Path, out: Path | None, cli: str, *, check: bool = True, artifacts: bool = True,
               nic_in_inventory: bool = False, facts: Plan | None = None) -> Plan:
    """Check, render and plan in memory, then write DIR's files, the plan last. A spec the plan cannot be made of
    (a failed check, a missing artifact, a node path outside the deploy root) writes none of them (only check's
    cache of a profile that passed): no plan is left behind, and an earlier one in DIR stays as it was.

    Without artifacts (`plan --no-artifacts`, a spec planned before its files exist) it is a preview: check's rules
    that need no file, the node paths, copies and mounts, and nothing written (out is not used): the artifacts'
    checksums are part of the job's identity, so a plan the nodes take needs the files (its job_id stays empty).

    With facts (`plan --artifacts-from`, deploy.shared_storage on a controller without the models): the plan the
    head made of the same spec where the models are (in the training container), whose checksums and parameter
    count are taken as they are; no artifact is read here, and check's rules that read them ran there."""
    spec = load_spec(spec_path)
    if facts is not None and not spec.deploy.shared_storage:
        raise SpecError("--artifacts-from: only a deploy.shared_storage spec is planned from the head's checksums "
                        "(without shared storage the controller sends the files, so it reads them)")
    if facts is not None and facts.name != spec.name:
        raise SpecError(f"--artifacts-from: that plan is of run {facts.name}, this spec is run {spec.name}")
    if check:
        refuse_check_errors(spec, spec_path, out / PROFILE_CHECK_CACHE if artifacts and out and facts is None
                            else None, artifacts and facts is None, nic_in_inventory)
    rendered = render(spec)
    out = out if artifacts and out is not None else PREVIEW_DIR  # a preview names it, never writes it
    cache_file = out / CACHE_FILE
    cache = json.loads(cache_file.read_text()) if artifacts and cache_file.is_file() else {}

    root = spec.deploy_root
    node_paths = {what: spec.node_path(what) for what in spec.artifacts()}
    node_paths["plan"] = f"{root}/{PLAN_FILE}"
    copies, sums = [], {}
    for what in spec.artifacts():
        local = spec.local_path(what)
        there = facts is None and local is not None and local.exists()  # (on the head only: not looked at)
        if artifacts and facts is None and not there:
            raise SpecError(f"{what}: {local} does not exist on the controller (field "
                            f"{'model.' + what if what in ('bf16', 'int8', 'profile') else 'data.' + what})")
        if not spec.deploy.shared_storage:  # (a preview's missing file: the kind its field names)
            kind = ("dir" if local.is_dir() else "file") if there else ("dir" if what in ("bf16", "int8") else "file")
            copies.append(Copy(what=what, src=str(local.resolve() if there else local), dest=node_paths[what],
                               kind=kind))
        if facts is not None:
            given = {key: sha for key, sha in facts.sha256.items() if key == what or key.startswith(what + "/")}
            if not given:
                raise SpecError(f"{what}: the head's plan has no checksum of {node_paths[what]}; plan it there again")
            sums.update(given)
        elif artifacts:
            sums.update(_checksums(what, local, cache))

    written: dict[Path, tuple[str, int]] = {}  # what goes into DIR once the whole plan is made
    if rendered.flashrl is not None:
        node_paths["flashrl"] = spec.node_path("flashrl")
        flashrl_text = dump_config(rendered.flashrl)
        flashrl_file = out / FLASHRL_FILE
        written[flashrl_file] = (flashrl_text, 0o644)
        copies.append(Copy(what="flashrl", src=str(flashrl_file.resolve() if artifacts else flashrl_file),
                           dest=node_paths["flashrl"], kind="file"))
        sums["flashrl"] = sha256_bytes(flashrl_text)

    # The verl job is the rendered launch.sh (env exports + the verl command), copied to every node.
    node_paths["launch"] = f"{root}/{LAUNCH_FILE}"
    launch_file = out / LAUNCH_FILE
    launch = launch_text(rendered)
    written[launch_file] = (launch, 0o755)
    copies.append(Copy(what="launch", src=str(launch_file.resolve() if artifacts else launch_file),
                       dest=node_paths["launch"], kind="file"))
    sums["launch"] = sha256_bytes(launch)
    steps = rendered.value("trainer.total_training_steps")
    for copy in copies:  # the send tree mirrors the deploy root: every copy lands in it
        try:
            PurePosixPath(copy.dest).relative_to(root)
        except ValueError:
            raise SpecError(f"deploy.root {root}: {copy.what}'s node path {copy.dest} does not lie inside it; "
                            "name a directory of its own for deploy.root") from None

    # the model's size: the head's count, else its safetensors headers here (not for a shared-storage preview,
    # which reads no model file: the head counts them)
    parameters = (facts.model_parameters if facts is not None else None
                  if spec.deploy.shared_storage and not artifacts else model_parameters(spec.local_path("bf16")))
    probe = [cli, "probe-job", "--plan", node_paths["plan"], "--nodes", str(spec.cluster.nnodes)]
    plan = Plan(
        name=spec.name, accelerator=spec.cluster.accelerator, nnodes=spec.cluster.nnodes,
        npus_per_node=spec.cluster.npus_per_node, quantization=spec.rollout.quantization, flashrl=spec.flashrl,
        deploy_root=root, node_paths=dict(sorted(node_paths.items())), copies=copies,
        sha256=dict(sorted(sums.items())), env=dict(sorted(rendered.env.items())),
        entrypoints={"probe": shlex.join(probe), "verl": shlex.join(["bash", node_paths["launch"]])},
        training_steps=int(steps[1]) if steps[0] and steps[1] is not None else None,
        image=load_lock().image_ref(), shared_dir=spec.cluster.shared_dir, checkpoint_dir=spec.checkpoint_dir,
        mounts=container_mounts([node_paths[what] for what in spec.artifacts()],
                                [root] + ([spec.cluster.shared_dir] if spec.cluster.shared_dir else []))
        if spec.deploy.shared_storage else [],
        **checkpoint_need(parameters, effective(rendered, "trainer.save_freq"),
                          effective(rendered, "trainer.max_actor_ckpt_to_keep"), steps[1] if steps[0] else None,
                          spec.cluster.nnodes, spec.cluster.shared_dir).plan_fields(),
    )
    if not artifacts:
        return plan
    plan.job_id = f"rollout8-{spec.name}-{plan.identity()}"
    if facts is not None and facts.job_id and facts.job_id != plan.job_id:  # (before anything is written)
        raise SpecError(f"--artifacts-from: the head planned job {facts.job_id}, this controller job {plan.job_id} "
                        "of the same checksums: the spec, its rendering or the node CLI differ between the two "
                        "(plan the same spec with the same bundle on both)")
    text = json.dumps(plan.to_json(), indent=2, sort_keys=True) + "\n"

    out.mkdir(parents=True, exist_ok=True)
    for path, (content, mode) in written.items():
        _refresh(path, content, mode=mode)
    arrival = arrivals(plan)  # (stats the copies' sources: the FlashRL YAML and launch.sh just written too)
    write_send_tree(out / SEND_TREE, arrival)
    _refresh(out / ARRIVAL_FILE, json.dumps(arrival, indent=1, sort_keys=True) + "\n")
    _refresh(out / PLAN_FILE, text)
    atomic_write(cache_file, json.dumps(cache, sort_keys=True))
    return plan
