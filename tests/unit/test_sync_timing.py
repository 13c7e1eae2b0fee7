"""Per-part timing of every weight sync (issue 29, part 1): rollout8.node.sync_timing wraps verl's rollout_mode,
the engine's update_weights/resume/release, FlashRL's quantize function and its re-run of the post-load step, and
writes one line per sync in which every moment is charged to exactly one part.

Attribution is checked on a clock the test advances (deterministic: each stand-in step advances it by a known amount),
on classes with verl's method names and call order (verl itself is not in the unit tier's environment; the
cluster tier reads the lines of the real job). Requantization is checked with the real FlashRL quantizer."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest
import upstream_wheels as uw

from rollout8.node import after_import, patches, sync_timing
from rollout8.results import sync_timing as results

torch = pytest.importorskip("torch")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(sync_timing, "_clock", fake)
    monkeypatch.setattr(sync_timing._State, "current", None)
    monkeypatch.setattr(sync_timing._State, "sleep", 0.0)
    monkeypatch.setattr(sync_timing._State, "count", 0)
    monkeypatch.setattr(sync_timing._State, "event_cost", 0.0)
    return fake


def stand_ins(clock: Clock, postload_module):
    """Classes shaped as verl 0.6.1's hybrid worker and sync vLLMRollout: rollout_mode builds the state dict, wakes
    the engine, hands a per-tensor generator to update_weights, whose load (FlashRL's) runs the quantize generator
    and then the post-load function it looks up on the vLLM module; trainer_mode releases the engine."""
    tensors = {f"layer{i}.weight": torch.ones(4, 8, dtype=torch.bfloat16) for i in range(3)}

    class Rollout:
        quantize = None

        async def resume(self, tags):
            clock.advance(0.5 if tags == ["weights"] else 0.25)

        async def release(self):
            clock.advance(2.0)

        async def update_weights(self, weights, **kwargs):
            clock.advance(0.01)  # the engine's own bookkeeping before the first tensor
            source = self.quantize(weights, None) if self.quantize else weights
            for _name, _tensor in source:
                clock.advance(0.1)  # copy into the engine's parameter
            postload_module.process_weights_after_loading(None, None, None)

    class Worker:
        def __init__(self):
            self.rollout = Rollout()

        async def rollout_mode(self):
            clock.advance(1.0)  # state_dict, key conversion

            def per_tensor():
                for name, tensor in tensors.items():
                    clock.advance(0.2)  # unshard + copy to the device
                    yield name, tensor

            await self.rollout.resume(tags=["weights"])
            await self.rollout.update_weights(per_tensor())
            await self.rollout.resume(tags=["kv_cache"])

        async def trainer_mode(self):
            await self.rollout.release()

    return Worker, Rollout


@pytest.fixture
def postload(monkeypatch, clock):
    module = types.ModuleType("vllm.model_executor.model_loader.utils")
    module.process_weights_after_loading = lambda *a: clock.advance(0.75)
    monkeypatch.setitem(sys.modules, "vllm.model_executor.model_loader.utils", module)
    return module


def one_step(worker) -> None:
    asyncio.run(worker.rollout_mode())
    asyncio.run(worker.trainer_mode())


def test_every_moment_of_a_bf16_sync_goes_to_one_part(clock, postload, capsys):
    Worker, Rollout = stand_ins(clock, postload)
    sync_timing.wrap_worker(Worker)
    sync_timing.wrap_rollout(Rollout)
    worker = Worker()
    one_step(worker)
    one_step(worker)
    lines = [results.parse_line(x) for x in capsys.readouterr().err.splitlines()]
    assert [x["n"] for x in lines] == [1, 2]
    first, second = lines
    assert first["quant"] == "bf16" and first["tensors"] == 3 and first["bytes"] == 3 * 4 * 8 * 2
    assert first["loaded_bytes"] == first["bytes"]
    expected = {"gather": 1.0 + 3 * 0.2, "requant": 0.0, "load": 0.01 + 3 * 0.1, "postload": 0.75,
                "switch": 0.5 + 0.25}
    assert first["parts"] == pytest.approx(expected)
    assert first["total"] == pytest.approx(sum(expected.values()))
    # the sleep after the first generation is the second sync's: the switch back it undoes
    assert second["parts"] == pytest.approx({**expected, "switch": 0.75 + 2.0})
    assert second["total"] == pytest.approx(sum(expected.values()) + 2.0)


def test_the_real_flashrl_quantizer_is_the_requant_part(clock, postload, capsys, flashrl_pristine, tmp_path):
    """FlashRL's own int8 quantizer (the wheel at the pin, with the bundle's patches) behind the wrapped
    get_quantize_fn: its time, without waiting for verl's tensors, is `requant`; the engine is given int8 tensors,
    counted as loaded_bytes."""
    site = uw.copy_tree(flashrl_pristine, tmp_path / "site-packages")
    assert {r.state for r in patches.apply_patches(site, "flash_rl")} == {patches.APPLIED}
    quantization = uw.load_quantization(site)
    sync_timing.wrap_quantize(quantization)
    real_linear_quantize = quantization.linear_quantize

    def linear_quantize(name, tensor, profile):
        clock.advance(0.3)
        return real_linear_quantize(name, tensor, profile)

    quantization.linear_quantize = linear_quantize  # flash_quantize looks it up at call time
    profile = {f"layer{i}.weight": {"output_scale": torch.full((4, 1), 100.0), "input_scale": 1.0,
                                    "type": torch.int8} for i in range(3)}
    Worker, Rollout = stand_ins(clock, postload)
    fn = quantization.get_quantize_fn("int8")
    Rollout.quantize = staticmethod(lambda weights, _profile: fn(weights, profile))
    sync_timing.wrap_worker(Worker)
    sync_timing.wrap_rollout(Rollout)
    one_step(Worker())
    [line] = [results.parse_line(x) for x in capsys.readouterr().err.splitlines() if sync_timing.MARKER in x]
    assert line["quant"] == "int8"
    assert line["parts"]["requant"] == pytest.approx(3 * 0.3)
    assert line["parts"]["gather"] == pytest.approx(1.0 + 3 * 0.2)  # verl's waits are not the quantizer's
    assert line["bytes"] == 3 * 64 and line["loaded_bytes"] == 3 * 32  # bf16 sent, int8 loaded


def test_outside_a_sync_the_wrappers_only_pass_through(clock, postload, capsys):
    Worker, Rollout = stand_ins(clock, postload)
    sync_timing.wrap_rollout(Rollout)
    sync_timing.wrap_rollout(Rollout)  # a second wrap is a no-op
    weights = [("w", torch.zeros(2))]
    asyncio.run(Rollout().update_weights(iter(weights)))
    assert sync_timing.MARKER not in capsys.readouterr().err
    assert sync_timing._State.current is None


def test_an_upstream_without_the_wrapped_class_is_named_not_fatal(capsys):
    hook = sync_timing._guarded(sync_timing.wrap_worker, sync_timing.WORKERS, "ActorRolloutRefWorker")
    hook(types.ModuleType(sync_timing.WORKERS))
    err = capsys.readouterr().err
    assert "timing unavailable" in err and "has no ActorRolloutRefWorker" in err


def test_the_hooks_arm_when_the_module_is_imported_and_can_be_turned_off(monkeypatch, tmp_path):
    monkeypatch.setenv(sync_timing.ENV, "0")
    assert sync_timing.install() == "disabled"
    package = tmp_path / "late_pkg_for_sync_timing"
    package.mkdir()
    (package / "__init__.py").write_text("class ActorRolloutRefWorker:\n    async def rollout_mode(self):\n"
                                         "        return 'done'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    after_import.register("late_pkg_for_sync_timing", "test", lambda m: seen.append(m.__name__))
    assert seen == []
    import late_pkg_for_sync_timing  # noqa: F401

    assert seen == ["late_pkg_for_sync_timing"]
    after_import.register("late_pkg_for_sync_timing", "test", lambda m: seen.append("again"))
    assert seen == ["late_pkg_for_sync_timing"]  # once per (module, name)


def test_its_own_cost_is_measured_and_reported():
    sync_timing._State.event_cost = None
    cost = sync_timing._event_cost()
    assert 0 < cost < 0.001
    sync = sync_timing.Sync()
    sync.events = 100
    text = sync_timing.line(sync, 1, "0", "n", sync.events * cost, 0.0)
    assert results.parse_line(text)["overhead"] == pytest.approx(100 * cost, abs=1e-4)


def test_a_cost_of_tens_of_microseconds_survives_the_line():
    """A sync's timing costs ~10-50 us (about 100 events): printed at 4 decimals it read 0 and the bench said 0x."""
    text = sync_timing.line(sync_timing.Sync(), 1, "0", "n", 3.2e-5, 0.0)
    assert results.parse_line(text)["overhead"] == pytest.approx(3.2e-5, rel=0.05)


def _sync_line(n: int, rank: int, node: str, seconds: dict, quant: str = "int8", t: float = 0.0) -> str:
    sync = sync_timing.Sync()
    sync.seconds = {**dict.fromkeys(sync_timing.PARTS, 0.0), **seconds}
    sync.quant, sync.bytes, sync.loaded_bytes, sync.tensors = quant, 2000, 1000, 10
    return sync_timing.line(sync, n, str(rank), node, 0.001, t or 1000.0 + n)


def test_progress_and_logs_show_the_last_sync_of_every_rank_from_the_worker_logs(tmp_path):
    """The driver log carries Ray's folded form of the lines (one rank's line standing for the others); the worker
    logs collected beside it carry each rank's own: the last sync is read per rank, once each."""
    from rollout8.results.progress import progress_line, read_progress

    job = tmp_path / "raysubmit_1"
    parts = {1: {"gather": 0.4, "load": 0.3, "requant": 0.2}, 2: {"gather": 0.5, "load": 0.3, "requant": 0.25}}
    driver = [f"(WorkerDict pid=11, ip=10.1.0.1) {_sync_line(n, 0, 'head', parts[n])} [repeated 2x across cluster]"
              for n in (1, 2)]
    (job).mkdir()
    (job / "driver.log").write_text("step:1 - timing_s/step:3.0\n" + "\n".join(driver) + "\n")
    for rank, node in enumerate(("head", "w1", "w2")):
        logs = job / node / "logs"
        logs.mkdir(parents=True)
        slower = {p: v * (1 + rank) for p, v in parts[2].items()}
        (logs / f"worker-ab-{rank}.err").write_text(
            "\n".join((_sync_line(1, rank, node, parts[1]), _sync_line(2, rank, node, slower))) + "\n")
    progress = read_progress(job)
    assert progress.sync.startswith("last weight sync (n=2, int8, 3 ranks): ")
    assert "slowest rank 2 (w2) 3.15 s" in progress.sync
    line = progress_line("raysubmit_1", "RUNNING", progress)
    assert line == "job raysubmit_1 RUNNING: step 1, step time 3 s"  # the sync is a line of its own
    assert progress.to_json()["sync"] == progress.sync
    records = results.read(job / "driver.log")
    assert sorted((r.rank, r.n) for r in records) == [(str(k), n) for k in range(3) for n in (1, 2)]


def test_means_leave_out_the_first_sync_and_name_the_largest_difference():
    int8 = results.read_lines([_sync_line(1, 0, "a", {"load": 9.0}),
                               _sync_line(2, 0, "a", {"gather": 0.4, "requant": 0.3, "load": 0.3}),
                               _sync_line(3, 0, "a", {"gather": 0.4, "requant": 0.5, "load": 0.3})])
    bf16 = results.read_lines([_sync_line(2, 0, "a", {"gather": 0.4, "load": 0.2}, quant="bf16")])
    a, b = results.means(int8), results.means(bf16)
    assert a.syncs == 2 and a.parts["load"] == pytest.approx(0.3) and a.parts["requant"] == pytest.approx(0.4)
    assert results.largest_difference(a, b) == ("requant", pytest.approx(0.4))
    assert results.means(int8[:1]) is None  # only the warm-up sync
    assert results.parse_line("rollout8: sync n=3 rank=0 total_s=") is None  # cut by a crash


def _run_dir(root, quant: str, load: float, requant: float) -> None:
    steps = "".join(f"step:{s} - timing_s/step:{3.0 + load} - timing_s/generate_sequences:1.0 - "
                    f"timing_s/update_actor:0.5 - critic/rewards/mean:0.1\n" for s in range(1, 5))
    (root / "node" / "logs").mkdir(parents=True)
    (root / "driver.log").write_text(steps)
    lines = [_sync_line(n, r, f"n{r}", {"gather": 0.4, "requant": requant, "load": load, "postload": 0.1}, quant)
             for n in range(1, 5) for r in range(2)]
    (root / "node" / "logs" / "worker-1.err").write_text("\n".join(lines) + "\n")


def test_report_shows_the_sync_table_and_picture_and_names_the_largest_difference(tmp_path):
    from rollout8.results.report import build

    _run_dir(tmp_path / "bf16", "bf16", load=0.3, requant=0.0)
    _run_dir(tmp_path / "int8", "int8", load=0.35, requant=0.6)
    summary = build([tmp_path / "bf16", tmp_path / "int8"], tmp_path / "out", labels=["bf16", "int8"],
                    modes=["bf16", "int8"])
    assert summary["sync"]["int8"]["syncs"] == 6 and summary["sync"]["int8"]["parts_s"]["requant"] == 0.6
    assert summary["sync_findings"] == ["int8 vs bf16: the largest difference is requantize (+0.6 s per sync, "
                                        "sync total 1.81x)"]
    assert "sync.png" in summary["pictures"]
    data = (tmp_path / "out" / "sync.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Weight sync by part" in page and "the largest difference is requantize" in page
