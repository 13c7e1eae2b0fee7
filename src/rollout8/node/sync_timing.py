"""Where each weight sync's time goes, on every rollout rank (issue: weight sync seen and cut, part 1).

install() (called by rollout8.node.activation.activate, once per process that imports verl) wraps, as each module
is imported (rollout8.node.after_import), the calls a sync in verl's hybrid engine goes through at the pin (verl
0.6.1 / 51d2104, sync rollout mode):

- `ActorRolloutRefWorker.rollout_mode` (verl/workers/fsdp_workers.py): the whole sync, from the trainer's state
  dict to an engine ready to generate;
- `vLLMRollout.update_weights` (verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py): the engine's load, fed
  by verl's per-tensor generator (FSDP unshard `full_tensor()` and the copy to the engine's device, done as the
  engine pulls each tensor); `resume` / `release`: the engine's wake-up and its sleep (release runs in
  `trainer_mode`, after generation, and is charged to the next sync);
- FlashRL's quantize function (`flash_rl.vllm_patch.get_quantize_fn`): the int8 requantization, a generator
  between verl's and the engine's load;
- FlashRL's re-run of vLLM's post-load processing (`model_loader.utils.process_weights_after_loading`, which
  FlashRL replaces and calls after each load; vLLM's W8A8 kernels transpose there, vllm-ascend casts to NZ).

Every moment of a sync is charged to exactly one part, the innermost running (a stack): the parts add up to the
total. One line per sync per rank, on stderr (collected with the worker logs; Ray folds lines that differ only in
digits in the driver log, so readers take the worker logs):

  rollout8: sync n=<k> rank=<r> node=<host> quant=<int8|bf16|fn> gather_s=.. requant_s=.. load_s=.. postload_s=..
    switch_s=.. total_s=.. bytes=<sent by the trainer> loaded_bytes=<given to the engine> tensors=<n>
    overhead_s=<estimated cost of this timing> t=<epoch s>

- gather_s: everything in rollout_mode that is not one of the parts below (state dict, key conversion, cache
  frees) plus the time the engine waited on verl's generator (unshard and copy of each tensor);
- requant_s: inside FlashRL's quantize generator, without the time it waited for verl's tensors (0 for bf16);
- load_s: inside the engine's load_weights, without waiting on the generators and without post-load;
- postload_s: FlashRL's re-run of the post-load processing;
- switch_s: the engine's wake-up in this sync plus its sleep in the switch back that preceded it;
- total_s: rollout_mode plus that sleep.

ROLLOUT8_SYNC_TIMING=0 turns it off. Nothing here needs torch at import.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import time

from . import after_import

MARKER = "rollout8: sync"
ENV = "ROLLOUT8_SYNC_TIMING"
PARTS = ("gather", "requant", "load", "postload", "switch")
WORKERS = "verl.workers.fsdp_workers"
SPMD = "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd"
FLASHRL = "flash_rl.vllm_patch"
POSTLOAD_MODULES = ("vllm.model_executor.model_loader.loader", "vllm.model_executor.model_loader.utils")
POSTLOAD_NAMES = ("_process_weights_after_loading", "process_weights_after_loading")
_WRAPPED = "__rollout8_sync_timing__"
_clock = time.perf_counter


class Sync:
    """One sync's clock: a stack of parts; the time between two events goes to the part on top."""

    def __init__(self, carried_switch: float = 0.0):
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.seconds["switch"] = carried_switch
        self.stack: list[str] = []
        self.last = _clock()
        self.events = 0
        self.bytes = 0
        self.loaded_bytes = 0
        self.tensors = 0
        self.quant: str | None = None

    def enter(self, part: str) -> None:
        now = _clock()
        if self.stack:
            self.seconds[self.stack[-1]] += now - self.last
        self.stack.append(part)
        self.last = now
        self.events += 1

    def leave(self) -> None:
        now = _clock()
        self.seconds[self.stack.pop()] += now - self.last
        self.last = now
        self.events += 1

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


class _State:
    current: Sync | None = None  # the sync in progress in this process
    sleep = 0.0  # engine sleep since the last sync, charged to the next one
    count = 0
    quant: str | None = None  # FlashRL's quantize function, once the engine asked for it
    event_cost: float | None = None


def _event_cost() -> float:
    """Seconds one enter or leave costs, measured once per process (for the line's overhead_s)."""
    if _State.event_cost is None:
        probe = Sync()
        start = _clock()
        for _ in range(200):
            probe.enter("load")
            probe.leave()
        _State.event_cost = (_clock() - start) / 400
    return _State.event_cost


class _Part:
    """`with _Part("load"):` charges the block to a part of the sync in progress; outside a sync, nothing."""

    def __init__(self, part: str):
        self.part = part
        self.sync = None

    def __enter__(self):
        self.sync = _State.current
        if self.sync is not None:
            self.sync.enter(self.part)

    def __exit__(self, *exc):
        if self.sync is not None and self.sync.stack:
            self.sync.leave()
        return False


def _nbytes(tensor) -> int:
    try:
        return int(tensor.numel()) * int(tensor.element_size())
    except Exception:  # not a tensor (a DTensor that is never materialised here, or another object): not counted
        return 0


def timed_items(items, part: str, counter: str):
    """Yield items from a (name, tensor) iterator, charging the time spent getting each to `part` and counting the
    tensors' bytes into the sync's `counter` ("bytes" or "loaded_bytes")."""
    iterator = iter(items)
    while True:
        with _Part(part):
            try:
                item = next(iterator)
            except StopIteration:
                return
        sync = _State.current
        if sync is not None and isinstance(item, tuple) and len(item) == 2:
            setattr(sync, counter, getattr(sync, counter) + _nbytes(item[1]))
            if counter == "bytes":
                sync.tensors += 1
        yield item


def _rank() -> str:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return str(dist.get_rank())
    except Exception:  # no torch, or a half-built group: the environment says it as well
        pass
    return os.environ.get("RANK", "-")


def line(sync: Sync, n: int, rank: str, node: str, overhead: float, now: float) -> str:
    parts = " ".join(f"{part}_s={sync.seconds[part]:.4f}" for part in PARTS)
    loaded = sync.loaded_bytes if sync.quant else sync.bytes
    return (f"{MARKER} n={n} rank={rank} node={node} quant={sync.quant or 'bf16'} {parts} total_s={sync.total:.4f} "
            f"bytes={sync.bytes} loaded_bytes={loaded} tensors={sync.tensors} overhead_s={overhead:.6f} t={now:.3f}")


def _begin() -> Sync:
    _State.current = Sync(carried_switch=_State.sleep)
    _State.sleep = 0.0
    _State.current.enter("gather")
    return _State.current


def _end() -> None:
    sync, _State.current = _State.current, None
    if sync is None:
        return
    while sync.stack:
        sync.leave()
    sync.quant = sync.quant or (_State.quant if sync.seconds["requant"] > 0 else None)
    _State.count += 1
    overhead = sync.events * _event_cost()
    print(line(sync, _State.count, _rank(), socket.gethostname(), overhead, time.time()), file=sys.stderr, flush=True)


@contextlib.contextmanager
def measure():
    """A sync outside verl's worker (the NPU acceptance suite's timed load): the block is one sync, its line is
    written at the end; yields the Sync, whose `seconds` hold the parts afterwards. Inside, `part("load")` and
    timed_items() charge what the block does, as verl's calls are charged in a job."""
    sync = _begin()
    try:
        yield sync
    finally:
        _end()


def part(name: str) -> _Part:
    return _Part(name)


# --- the wrappers ---------------------------------------------------------------------------------------------

def _mark(fn):
    setattr(fn, _WRAPPED, True)
    return fn


def wrap_worker(cls) -> None:
    """rollout_mode: the sync, from the trainer's state dict to an engine ready to generate."""
    rollout_mode = getattr(cls, "rollout_mode", None)
    if rollout_mode is None or hasattr(rollout_mode, _WRAPPED):
        return

    @functools.wraps(rollout_mode)
    async def timed_rollout_mode(self, *args, **kwargs):
        _begin()
        try:
            return await rollout_mode(self, *args, **kwargs)
        finally:
            _end()
    cls.rollout_mode = _mark(timed_rollout_mode)


def wrap_rollout(cls) -> None:
    """update_weights: the load, fed by verl's generator (gather); resume: wake-up; release: sleep."""
    update, resume, release = (getattr(cls, n, None) for n in ("update_weights", "resume", "release"))
    if update is not None and not hasattr(update, _WRAPPED):
        @functools.wraps(update)
        async def timed_update_weights(self, weights, *args, **kwargs):
            if _State.current is None:
                return await update(self, weights, *args, **kwargs)
            wrap_postload()
            with _Part("load"):
                return await update(self, timed_items(weights, "gather", "bytes"), *args, **kwargs)
        cls.update_weights = _mark(timed_update_weights)
    if resume is not None and not hasattr(resume, _WRAPPED):
        @functools.wraps(resume)
        async def timed_resume(self, *args, **kwargs):
            with _Part("switch"):
                return await resume(self, *args, **kwargs)
        cls.resume = _mark(timed_resume)
    if release is not None and not hasattr(release, _WRAPPED):
        @functools.wraps(release)
        async def timed_release(self, *args, **kwargs):
            if _State.current is not None:
                with _Part("switch"):
                    return await release(self, *args, **kwargs)
            start = _clock()  # after generation (trainer_mode), outside a sync: charged to the next one
            try:
                return await release(self, *args, **kwargs)
            finally:
                _State.sleep += _clock() - start
        cls.release = _mark(timed_release)


def wrap_quantize(module) -> None:
    """FlashRL asks get_quantize_fn(name) once per engine; its function maps verl's (name, tensor) generator to the
    engine's. The time inside it, without waiting for verl's tensors, is the requantization."""
    get = getattr(module, "get_quantize_fn", None)
    if get is None or hasattr(get, _WRAPPED):
        return

    @functools.wraps(get)
    def timed_get_quantize_fn(name, *args, **kwargs):
        fn = get(name, *args, **kwargs)
        _State.quant = str(name)

        @functools.wraps(fn)
        def timed_quantize(weights, *qargs, **qkwargs):
            sync = _State.current
            if sync is not None:
                sync.quant = str(name)
            return timed_items(fn(weights, *qargs, **qkwargs), "requant", "loaded_bytes")
        return timed_quantize

    module.get_quantize_fn = _mark(timed_get_quantize_fn)


def wrap_postload() -> None:
    """FlashRL replaces vLLM's post-load function at engine construction and looks it up by attribute at each
    sync; wrapped on the first sync, after FlashRL has put its own in place."""
    for module_name in POSTLOAD_MODULES:
        module = sys.modules.get(module_name)
        for attr in POSTLOAD_NAMES:
            fn = getattr(module, attr, None) if module is not None else None
            if fn is None or hasattr(fn, _WRAPPED):
                continue

            def timed_postload(*args, _fn=fn, **kwargs):
                with _Part("postload"):
                    return _fn(*args, **kwargs)
            setattr(module, attr, _mark(timed_postload))


def install() -> str:
    """Arm the wrappers (each when its module is imported). Returns the activation line's field value."""
    if os.environ.get(ENV, "1") == "0":
        return "disabled"
    after_import.register(WORKERS, "sync-timing", _guarded(wrap_worker, WORKERS, "ActorRolloutRefWorker"))
    after_import.register(SPMD, "sync-timing", _guarded(wrap_rollout, SPMD, "vLLMRollout"))
    after_import.register(FLASHRL, "sync-timing", _guarded(wrap_quantize, FLASHRL, None))
    return "yes"


def _guarded(wrap, module_name: str, attr: str | None):
    """A wrapper that cannot take the upstream import down: what it cannot find or wrap, it names on stderr."""
    def hook(module):
        target = module if attr is None else getattr(module, attr, None)
        try:
            if target is None:
                raise AttributeError(f"{module_name} has no {attr}")
            wrap(target)
        except Exception as exc:
            print(f"{MARKER} timing unavailable: {type(exc).__name__}: {exc} (this verl or FlashRL differs from "
                  "the pin; sync lines will lack parts)", file=sys.stderr, flush=True)
    return hook
