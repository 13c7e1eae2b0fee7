"""The run spec: one YAML file per training run (configs/runs/*.yaml), loaded into a typed model.

Every field is declared here; an unknown or misspelled field fails at load with its dotted path
(`extra="forbid"`), before anything touches a node. Relative paths resolve against the spec file's
directory. `rollout8 check --explain` prints the field reference generated from this module.

Paths come in two kinds:
- *local* paths (model.bf16, model.int8, model.profile, data.*): where the artifacts are on the machine
  that runs `rollout8 render` / Ansible. The bundle copies them to every node under `deploy.root`.
- *node* paths: where the artifacts are on every node. By default `<deploy.root>/models/bf16`,
  `<deploy.root>/models/int8`, `<deploy.root>/profile.pt`, `<deploy.root>/data/<file>` and
  `<deploy.root>/flashrl.yaml`. With `deploy.shared_storage: true` the models, profile and data are
  already on every node (shared storage) at the absolute paths given, and nothing is copied.
"""

from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from ..errors import SpecError
from ..fileutil import sha256_json
from ..models import FrozenModel
from ..yamlio import read_yaml
from . import verl_keys
from .node_path import deploy_root_problem, node_absolute, within

DEFAULT_DEPLOY_ROOT = "/var/lib/rollout8/runs/{name}"
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
PORT_RANGE_PATTERN = r"^\d{1,5}-\d{1,5}$"
# What a run's checkpoints cannot be resumed under (its resume identity, the key of its checkpoint directory): the
# weights it started from, the training data, how the weights are sharded (nodes, NPUs per node, the actor's FSDP
# and sequence-parallel layout) and the batch shape (the dataloader's saved position and the optimizer's schedule
# follow it). verl keys are matched whole, or by prefix for those ending in a dot. Any other edit (the save
# frequency, logging, an environment key, the learning rate, the number of steps, the rollout's settings) resumes.
RESUME_VERL_KEYS = ("data.train_batch_size", "data.shuffle", "data.seed", "actor_rollout_ref.model.",
                    "actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.fsdp_config.",
                    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                    "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.rollout.n",
                    "algorithm.adv_estimator", "trainer.nnodes", "trainer.n_gpus_per_node")


RESUME_SPEC_KEYS = ("name", "model.bf16", "data.train", "cluster.nnodes", "cluster.npus_per_node")


def resumes_under(key: str) -> bool:
    """Whether a run's checkpoints can be resumed after an edit of this spec key (dotted: `model.bf16`,
    `verl.data.train_batch_size`, `env.FOO`); RESUME_VERL_KEYS says which cannot."""
    if key in RESUME_SPEC_KEYS:
        return False
    if key.startswith("verl."):
        bare = key[len("verl."):].lstrip("+~")
        return not any(bare == k or (k.endswith(".") and bare.startswith(k)) for k in RESUME_VERL_KEYS)
    return True


class _Strict(FrozenModel):
    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info) -> Any:
        """pydantic turns `nnodes: true` into 1 and `0.5` into a float field's 0.5 alike: a YAML boolean where a
        number belongs is a typo (or a misplaced line), never meant."""
        if isinstance(value, bool) and info.field_name in cls.model_fields:
            annotation = cls.model_fields[info.field_name].annotation
            kinds = set(get_args(annotation)) | {annotation}
            if kinds & {int, float} and bool not in kinds:
                raise ValueError(f"{str(value).lower()} is a boolean; this field takes a number")
        return value


class ModelSpec(_Strict):
    """The policy model: bf16 weights for the trainer, the int8 twin and profile for FlashRL rollouts."""

    bf16: Path = Field(description="HF directory of the bf16 model (trainer weights, and the rollout for bf16).")
    int8: Path | None = Field(None, description="W8A8 int8 model directory (required for int8 and hybrid).")
    profile: Path | None = Field(
        None, description="FlashRL int8 profile (`rollout8 profile`); default: <int8>/profile.pt.")
    layout: Literal["compressed-tensors", "ascend"] = Field(
        "compressed-tensors",
        description="layout of the int8 model: compressed-tensors (HF W8A8) or ascend (vllm-ascend "
                    "W8A8_DYNAMIC, written by `rollout8 convert`).")
    moe: bool | None = Field(
        None, description="the model is a mixture of experts; null: detect from config.json when readable.")

    @property
    def profile_path(self) -> Path | None:
        if self.profile is not None:
            return self.profile
        return None if self.int8 is None else self.int8 / "profile.pt"


class HybridMix(_Strict):
    """How many FlashRL config entries of each kind; DP rollout worker k uses entry k % (int8 + bf16)."""

    int8: int = Field(1, ge=1, description="number of int8 entries in the FlashRL config list.")
    bf16: int = Field(1, ge=1, description="number of bf16 entries in the FlashRL config list.")


class RolloutSpec(_Strict):
    quantization: Literal["int8", "bf16", "hybrid"] = Field(
        description="int8: every rollout worker runs int8 (FlashRL); bf16: plain verl baseline, FlashRL off; "
                    "hybrid: FlashRL int8 and bf16 entries spread over DP rollout workers.")
    hybrid: HybridMix | None = Field(None, description="the int8/bf16 mix (hybrid only); default 1:1.")
    lmhead_fp32: bool = Field(
        False, description="FLASHRL_LMHEAD_FP32=1 (lm_head in fp32). Off by default on NPU: vllm-ascend's "
                           "lm_head classes skip FlashRL's patch.")

    @model_validator(mode="after")
    def _hybrid_only_for_hybrid(self) -> RolloutSpec:
        if self.hybrid is not None and self.quantization != "hybrid":
            raise ValueError("rollout.hybrid is only valid with rollout.quantization: hybrid")
        return self

    @property
    def mix(self) -> HybridMix | None:
        if self.quantization != "hybrid":
            return None
        return self.hybrid or HybridMix()


class NetworkSpec(_Strict):
    """Cluster network settings, exported on every node before `ray start` (HCCL/Gloo/TP sockets)."""

    nic: str | None = Field(
        None, description="cluster NIC name (HCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME); "
                          "HCCL_IF_IP is each node's address on it, set per node by Ansible.")
    hccl_connect_timeout: int = Field(
        600, ge=1, description="HCCL_CONNECT_TIMEOUT in seconds: how long a rank waits for its peers before it fails. "
                               "600 gives a slow multi-node start 10 minutes and bounds the hang of a rank that cannot "
                               "connect (the upstream recipe's 3000 lets it hang 50 minutes).")
    hccl_exec_timeout: int | None = Field(None, ge=1, description="HCCL_EXEC_TIMEOUT in seconds (unset: CANN default).")
    hccl_buffsize: int | None = Field(None, ge=1, description="HCCL_BUFFSIZE in MB (unset: CANN default).")
    hccl_host_socket_port_range: str | None = Field(
        "61000-61050", description="HCCL_HOST_SOCKET_PORT_RANGE: the host ports HCCL binds, above Linux's default "
        "ephemeral range (32768-60999), where CANN's own (60000-60015) lies: a port the kernel gave to an outgoing "
        "connection makes HCCL's bind fail at random. Preflight refuses a range inside the node's ephemeral range "
        "unless net.ipv4.ip_local_reserved_ports reserves it. Open it in the firewall; null: CANN's default.")
    hccl_npu_socket_port_range: str | None = Field(
        None, description="HCCL_NPU_SOCKET_PORT_RANGE, e.g. 61000-61050: ports on the NPUs' own network stack, not "
                          "the host's.")

    @field_validator("nic")
    @classmethod
    def _nic_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", value):
            raise ValueError(f"{value!r} is not a network interface name (e.g. eth0, enp189s0f0)")
        return value

    @field_validator("hccl_host_socket_port_range", "hccl_npu_socket_port_range")
    @classmethod
    def _port_range(cls, value: str | None) -> str | None:
        if value is not None:
            if not re.fullmatch(PORT_RANGE_PATTERN, value):
                raise ValueError(f"{value!r} is not a port range: LOW-HIGH, e.g. 60000-60050")
            low, high = (int(x) for x in value.split("-"))
            if not (1 <= low <= high <= 65535):
                raise ValueError(f"{value!r}: need LOW-HIGH with 1 <= LOW <= HIGH <= 65535")
        return value


class ClusterSpec(_Strict):
    nnodes: int = Field(ge=1, description="number of nodes (trainer.nnodes).")
    npus_per_node: int = Field(ge=1, description="accelerators used per node (trainer.n_gpus_per_node; 8 on A2).")
    node_kind: Literal["a2", "a3"] = Field(
        "a2", description="the Atlas nodes' kind, which bounds npus_per_node: a2 (Atlas 800T A2, 8 NPUs) or a3 "
                          "(Atlas A3, 16 NPUs).")
    accelerator: Literal["npu", "cpu"] = Field(
        "npu", description="npu: Ascend; cpu: the simulated CPU cluster (tests, demo), trainer.device=cpu.")
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    shared_dir: str | None = Field(
        None, description="absolute directory every node sees at the same path (an NFS mount, say): verl's "
                          "checkpoints go to <shared_dir>/<name>/<resume key>/checkpoints "
                          "(trainer.default_local_dir), the key a digest of what a checkpoint cannot be resumed "
                          "under (model, data, sharding, batch shape), and a resubmitted job resumes from the latest "
                          "(trainer.resume_mode=auto); preflight proves it is shared. Unset: no resume "
                          "after a failure.")

    _shared_absolute = field_validator("shared_dir")(lambda value: node_absolute(value))


class DataSpec(_Strict):
    train: Path = Field(description="training parquet file (data.train_files).")
    val: Path = Field(description="validation parquet file (data.val_files).")
    reward: Path | None = Field(
        None, description="Python file defining compute_score(data_source, solution_str, ground_truth, "
                          "extra_info=None): verl's custom_reward_function (copied to <deploy.root>/data/reward.py); "
                          "unset: verl's built-in rule rewards by data_source.")


class DeploySpec(_Strict):
    root: str | None = Field(
        None, description="absolute directory on every node for this run's artifacts and nothing else (reset.yml "
                          "removes it whole): not /, a system directory (/usr, /var/lib, /home/<user>...), a path "
                          "with '..' or one inside cluster.shared_dir; default /var/lib/rollout8/runs/<name>.")
    shared_storage: bool = Field(
        False, description="true: model, profile and data paths are already valid on every node (shared "
                           "storage, absolute paths) and are not copied; the docker runtime mounts each read-only "
                           "into the training container at the same path.")

    @field_validator("root")
    @classmethod
    def _root_of_its_own(cls, value: str | None) -> str | None:
        root = node_absolute(value)
        if root is None:
            return None
        if any(c.isspace() for c in root):
            raise ValueError(f"{value!r} holds a space: the node environment file (rollout8.env) cannot carry it; "
                             "give a path without spaces")
        problem = deploy_root_problem(root)
        if problem:
            raise ValueError(f"{value!r} {problem}; the deploy root is the run's alone (reset.yml removes it with "
                             "everything in it): give a directory of this run's own, such as "
                             "/var/lib/rollout8/runs/<name> (the default), /srv/rollout8/<name> or "
                             "/data/rollout8/<name>")
        return root


class RunSpec(_Strict):
    name: str = Field(pattern=NAME_PATTERN, description="run name: lower case, digits, '.', '_', '-'.")
    description: str = Field("", description="free text.")
    model: ModelSpec
    rollout: RolloutSpec
    cluster: ClusterSpec
    data: DataSpec
    deploy: DeploySpec = Field(default_factory=DeploySpec)
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment for every node and Ray worker (wins over the bundle's).")
    verl: dict[str, Any] = Field(
        default_factory=dict, description="verl hydra overrides: dotted key -> value; '+key' adds a key, "
                                          "'++key' adds or overrides, '~key' deletes. A section may be nested "
                                          "(actor_rollout_ref: {rollout: {n: 4}}): read as the dotted keys.")

    # Where the spec was loaded from (not a field of the file).
    source: Path | None = Field(None, exclude=True, repr=False)

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                    raise ValueError(f"{key!r} is not an environment variable name")
                if isinstance(item, bool):
                    item = "1" if item else "0"
                if item is None or isinstance(item, (dict, list)):
                    raise ValueError(f"{key}: value must be a string or number, got {item!r}")
                item = str(item)
                if "\n" in item:
                    raise ValueError(f"{key}: value must be one line")
                out[key] = item
            return out
        return value

    @field_validator("verl", mode="before")
    @classmethod
    def _verl_flat(cls, value: Any) -> Any:
        """Nested sections become the dotted keys they stand for (verl_keys.flatten); a key given twice is refused."""
        return verl_keys.flatten(value) if isinstance(value, dict) else value

    @field_validator("verl")
    @classmethod
    def _verl_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not re.fullmatch(r"(\+\+|\+|~)?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
                raise ValueError(f"{key!r} is not a dotted hydra key (optionally prefixed with +, ++ or ~)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _finite_numbers(cls, value: Any) -> Any:
        """NaN and infinity (`.nan`, `.inf` in YAML) are refused anywhere in the spec, naming the dotted field: no
        setting means one, and a NaN passes every range check (`nan < 0` and `nan > 1` are both false)."""
        found = list(_non_finite(value, ""))
        if found:
            raise ValueError("\n".join(f"{where}: {number} is not a finite number; give a number"
                                       for where, number in found))
        return value

    @model_validator(mode="after")
    def _deploy_root_outside_shared_dir(self) -> RunSpec:
        shared, root = self.cluster.shared_dir, self.deploy_root
        if shared is None:
            return self
        named = f"deploy.root {root!r}" if self.deploy.root else f"deploy.root (default {root!r})"
        if within(root, shared):
            where = "is" if root == shared else "lies inside"
            raise ValueError(f"{named} {where} cluster.shared_dir {shared!r}: every node would deploy into the "
                             "same shared directory and a reset would remove what the others use; give deploy.root "
                             "outside it (a directory on each node's own disk)")
        if within(shared, root):
            raise ValueError(f"cluster.shared_dir {shared!r} lies inside {named}: a reset removes the deploy root "
                             "and the checkpoints with it; give deploy.root outside the shared directory")
        return self

    @model_validator(mode="after")
    def _int8_needs_model(self) -> RunSpec:
        if self.rollout.quantization in ("int8", "hybrid") and self.model.int8 is None:
            raise ValueError(f"model.int8 is required for rollout.quantization: {self.rollout.quantization}")
        return self

    # ------------------------------------------------------------------ derived values
    @property
    def flashrl(self) -> bool:
        """Whether FlashRL runs at all (bf16 is the plain verl baseline)."""
        return self.rollout.quantization in ("int8", "hybrid")

    @property
    def deploy_root(self) -> str:
        return self.deploy.root or DEFAULT_DEPLOY_ROOT.format(name=self.name)

    def resume_identity(self) -> dict[str, Any]:
        """What this run's checkpoints cannot be resumed under (RESUME_VERL_KEYS says why), as `field: value`."""
        identity: dict[str, Any] = {"name": self.name, "model.bf16": str(self.model.bf16),
                                    "data.train": str(self.data.train), "cluster.nnodes": self.cluster.nnodes,
                                    "cluster.npus_per_node": self.cluster.npus_per_node}
        for key, value in sorted(self.verl.items()):
            if not resumes_under(f"verl.{key}"):
                identity[f"verl.{key.lstrip('+~')}"] = value
        return identity

    @property
    def checkpoint_dir(self) -> str | None:
        """verl's checkpoints (trainer.default_local_dir) on the shared directory, or None without one:
        <shared_dir>/<name>/<key>/checkpoints, the key a digest of the run's resume identity (resume_identity):
        a resubmission after an edit a checkpoint can be resumed under (the save frequency, an environment key, the
        learning rate) resumes from its latest checkpoint; an edit of the model, the data, the sharding or the batch
        shape starts from step 0 in a directory of its own instead of loading a checkpoint it cannot use."""
        if self.cluster.shared_dir is None:
            return None
        key = sha256_json(self.resume_identity(), default=str)[:12]
        return str(PurePosixPath(self.cluster.shared_dir) / self.name / key / "checkpoints")

    def node_path(self, what: str) -> str:
        """Where an artifact is on every node: what in bf16, int8, profile, flashrl, train, val, reward."""
        root = PurePosixPath(self.deploy_root)
        if what == "flashrl":
            return str(root / "flashrl.yaml")
        local = self.local_path(what)
        if self.deploy.shared_storage:
            return str(local) if local is not None else ""
        if what in ("bf16", "int8"):
            return str(root / "models" / what)
        if what == "profile":
            return str(root / "profile.pt")
        if what in ("train", "val"):
            assert local is not None
            return str(root / "data" / f"{what}{''.join(local.suffixes) or '.parquet'}")
        if what == "reward":
            return str(root / "data" / "reward.py")
        raise KeyError(what)

    def local_path(self, what: str) -> Path | None:
        return {
            "bf16": self.model.bf16,
            "int8": self.model.int8,
            "profile": self.model.profile_path,
            "train": self.data.train,
            "val": self.data.val,
            "reward": self.data.reward,
        }[what]

    def artifacts(self) -> list[str]:
        """The artifacts this run needs on every node, in a fixed order."""
        names = ["bf16"]
        if self.flashrl:
            names += ["int8", "profile"]
        return names + ["train", "val"] + (["reward"] if self.data.reward is not None else [])


def _non_finite(value: Any, where: str):
    """(dotted field, number) of every NaN or infinity in a raw spec: mappings by key, lists by [index]."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where or "(top level)", value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _non_finite(item, f"{where}[{index}]")


def _resolve(base: Path, value: Any) -> Any:
    if value is None:
        return None
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def _resolve_paths(raw: dict, base: Path) -> dict:
    """Resolve the local path fields against the spec's directory (only where the mapping shape is right;
    type errors are left to the model). On shared storage the paths are node paths: left as written, so
    `check` can refuse a relative one."""
    deploy = raw.get("deploy")
    if isinstance(deploy, dict) and deploy.get("shared_storage") is True:
        return raw
    for section, fields in (("model", ("bf16", "int8", "profile")), ("data", ("train", "val", "reward"))):
        block = raw.get(section)
        if isinstance(block, dict):
            for field in fields:
                if isinstance(block.get(field), (str, Path)):
                    block[field] = str(_resolve(base, block[field]))
    return raw


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (misspelled? see `rollout8 check --explain`)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "finite_number":
            msg = f"{err['input']} is not a finite number; give a number"
        msg = msg.removeprefix("Value error, ")
        # a rule across fields (a model validator, no location) names its fields in each of its lines itself
        lines += [f"{source}: {loc}: {line}" if loc else f"{source}: {line}" for line in msg.splitlines()]
    return "\n".join(lines)


def parse_spec(raw: Any, base: Path, source: str = "<spec>") -> RunSpec:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: a run spec is a YAML mapping (name:, model:, rollout:, cluster:, data:, ...)")
    raw = dict(raw)
    for section in ("model", "data"):
        if isinstance(raw.get(section), dict):
            raw[section] = dict(raw[section])
    raw = _resolve_paths(raw, base)
    try:
        return RunSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, source)) from None


# A run spec is a page of YAML; anything much larger is the wrong file (and would take minutes to parse).
MAX_SPEC_BYTES = 1_000_000


def load_spec(path: str | Path) -> RunSpec:
    """Load and validate a run spec; SpecError lists one line per bad field."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{path}: is a directory; give the run spec's YAML file (configs/runs/*.yaml)")
    if not path.exists():  # (one that is there but no regular file, a named pipe: read_yaml names it)
        raise SpecError(f"{path}: run spec not found")
    raw = read_yaml(path, what="run spec", error=SpecError, max_bytes=MAX_SPEC_BYTES)
    spec = parse_spec(raw, path.resolve().parent, str(path))
    return spec.model_copy(update={"source": path.resolve()})


def explain() -> str:
    """A field reference generated from the model (for `rollout8 check --explain` and configs/README.md)."""
    lines: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            if name == "source":
                continue
            annotation = field.annotation
            sub = _submodel(annotation)
            required = field.is_required()
            default = "" if required else f" (default: {_default_repr(field)})"
            desc = field.description or ""
            if sub is not None:
                lines.append(f"{prefix}{name}:{'' if required else ' (optional section)'} {desc}".rstrip())
                walk(sub, f"{prefix}{name}.")
            else:
                kind = _type_repr(annotation)
                lines.append(f"{prefix}{name} [{kind}]{' required' if required else ''}{default}: {desc}".rstrip())

    walk(RunSpec, "")
    return "\n".join(lines)


def _submodel(annotation: Any) -> type[BaseModel] | None:
    args = getattr(annotation, "__args__", None) or (annotation,)
    for arg in args:
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _type_repr(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return "|".join(str(a) for a in get_args(annotation))
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "").replace("pathlib.", "")


def _default_repr(field: Any) -> str:
    if field.default_factory is not None:
        return "{}"
    return "null" if field.default is None else repr(field.default)
