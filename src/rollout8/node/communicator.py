"""Every rank says when it starts waiting for its communicator and when it has joined it (issue: nodes as they come
from the vendor, part 7): a rank that never arrives is otherwise a silent wait of up to the process group's timeout
(verl: `nccl_timeout`, 600 s) or HCCL_CONNECT_TIMEOUT, and nothing names it.

watch() (called by rollout8.node.activation.activate, once per process that imports verl) wraps
`torch.distributed.init_process_group`, which verl's workers call as `torch.distributed.init_process_group(...)` at
their construction with every rank of the job in one group (backend `cpu:gloo,npu:hccl`). The gloo part connects
every rank to every other inside that call, so it returns once all ranks have arrived; HCCL's own links are made at
the first collective (torch_npu creates the communicator lazily) and are judged by HCCL's error codes
(rollout8.node.hccl_codes). The lines, on stderr (Ray forwards them into the job's driver log), one per event:

  rollout8: communicator state=waiting rank=5 world=8 node=<hostname> device=<id|-> backend=<b> master=<a:p> t=<s>
  rollout8: communicator state=still-waiting ... waited_s=180 t=...   (every ROLLOUT8_COMMUNICATOR_WARN_S, 180)
  rollout8: communicator state=joined ... waited_s=3.1 t=...
  rollout8: communicator state=failed ... waited_s=600 t=... error=<text, last>

`rollout8 progress` (rollout8.results.communicator) reads them: the ranks that never said `waiting` in a group whose
other ranks wait are the ones that have not joined, named with the node that is short of them.
ROLLOUT8_COMMUNICATOR_WATCH=0 turns the wrapper off. Nothing here needs torch: without it, watch() does nothing.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time

MARKER = "rollout8: communicator"
WARN_ENV = "ROLLOUT8_COMMUNICATOR_WARN_S"
WARN_S = 180.0
MAX_REMINDERS = 20  # still-waiting lines per call: a bounded number, whatever the group's timeout


def _device() -> str:
    """The NPU this rank drives: with one device visible (Ray's ASCEND_RT_VISIBLE_DEVICES for the actor) that one;
    with several, or all (RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES, as the run specs set it), the one its
    LOCAL_RANK picks, as verl's worker sets its device; else `-`."""
    visible = [d.strip() for d in os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "").split(",") if d.strip()]
    local = os.environ.get("LOCAL_RANK", "")
    if len(visible) == 1:
        return visible[0]
    if local.isdigit():
        return visible[int(local)] if int(local) < len(visible) else local
    return visible[0] if visible else "-"


def _master(kwargs: dict) -> str:
    method = kwargs.get("init_method") or ""
    if method.startswith("tcp://"):
        return method[len("tcp://"):].split("?")[0]
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return f"{addr}:{port}" if addr or port else "-"


def _fields(args: tuple, kwargs: dict) -> str:
    backend = kwargs.get("backend", args[0] if args else None)
    rank = kwargs.get("rank", os.environ.get("RANK", "-"))
    world = kwargs.get("world_size", os.environ.get("WORLD_SIZE", "-"))
    return (f"rank={rank} world={world} node={socket.gethostname()} device={_device()} "
            f"backend={str(backend or '-').replace(' ', '')} master={_master(kwargs)}")


def _say(state: str, fields: str, started: float, extra: str = "") -> None:
    now = time.time()
    waited = f" waited_s={now - started:.1f}" if state != "waiting" else ""
    print(f"{MARKER} state={state} {fields}{waited} t={now:.1f}{extra}", file=sys.stderr, flush=True)


def _warn_s() -> float:
    try:
        value = float(os.environ.get(WARN_ENV, WARN_S))
    except ValueError:
        return WARN_S
    return value if value > 0 else WARN_S


def wrap(init_process_group):
    """`init_process_group` that says when this rank starts waiting, is still waiting, joined or failed."""
    if getattr(init_process_group, "rollout8_watched", False):
        return init_process_group

    @functools.wraps(init_process_group)
    def watched(*args, **kwargs):
        fields = _fields(args, kwargs)
        started = time.time()
        joined = threading.Event()
        _say("waiting", fields, started)

        said = threading.Lock()  # no still-waiting after joined or failed: a reminder due as the call ends is dropped

        def remind() -> None:
            for _ in range(MAX_REMINDERS):
                if joined.wait(_warn_s()):
                    return
                with said:
                    if joined.is_set():
                        return
                    _say("still-waiting", fields, started)

        threading.Thread(target=remind, name="rollout8-communicator", daemon=True).start()
        try:
            result = init_process_group(*args, **kwargs)
        except BaseException as exc:
            with said:
                joined.set()
                _say("failed", fields, started, f" error={type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            raise
        with said:
            joined.set()
            _say("joined", fields, started)
        return result

    watched.rollout8_watched = True
    return watched


def watch() -> str:
    """Wrap torch.distributed.init_process_group in this process; returns what was done (for the activation line)."""
    if os.environ.get("ROLLOUT8_COMMUNICATOR_WATCH", "1") == "0":
        return "disabled"
    try:
        import torch.distributed as dist
    except ImportError:
        return "no-torch"
    if not hasattr(dist, "init_process_group"):
        return "no-torch-distributed"
    dist.init_process_group = wrap(dist.init_process_group)
    return "yes"
