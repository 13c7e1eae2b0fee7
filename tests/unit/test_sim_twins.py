"""The run specs `make bench` and `make demo-compare` derive from the demo's (virtual/sim_runs.py): each is a valid
spec for `rollout8 check`, differs from its source only where it says, and the bench's copies never resume."""

from __future__ import annotations

import yaml
from sim_runs import SHIPPED_SPEC, bf16_twin, clear_demo_runs, demo_runs, from_scratch, full_gc_twin

from rollout8.runspec.check import run_checks
from rollout8.runspec.runspec import load_spec


def _load(path):
    return yaml.safe_load(path.read_text())


def _errors(path) -> list[str]:
    """`rollout8 check`'s errors on a derived spec (its artifacts are the demo's, not built here)."""
    return [f.line() for f in run_checks(load_spec(path), artifacts=False) if f.level == "error"]


def test_the_full_gc_twin_is_the_int8_run_with_upstreams_collection(tmp_path):
    source, twin = _load(SHIPPED_SPEC), _load(full_gc_twin(SHIPPED_SPEC, tmp_path))
    assert _errors(full_gc_twin(SHIPPED_SPEC, tmp_path)) == []
    assert twin["env"]["ROLLOUT8_FLASHRL_FULL_GC"] == "1"
    assert twin["rollout"] == source["rollout"] and twin["cluster"] == source["cluster"]
    assert twin["name"] == source["name"] + "-fullgc" != source["name"]
    assert twin["deploy"]["root"] != source["deploy"]["root"]
    assert {k: v for k, v in twin["verl"].items() if k != "trainer.experiment_name"} == \
        {k: v for k, v in source["verl"].items() if k != "trainer.experiment_name"}


def test_bench_copies_never_resume_and_keep_their_source_apart(tmp_path):
    for source_path in (SHIPPED_SPEC, bf16_twin(SHIPPED_SPEC, tmp_path), full_gc_twin(SHIPPED_SPEC, tmp_path)):
        copy_path = from_scratch(source_path, tmp_path)
        assert _errors(copy_path) == [], copy_path.name
        source, copy = _load(source_path), _load(copy_path)
        assert copy["verl"]["trainer.resume_mode"] == "disable"
        assert copy["name"] == source["name"] + "-scratch"
        assert copy["deploy"]["root"] == source["deploy"]["root"] + "-scratch"
        assert copy["rollout"] == source["rollout"] and copy.get("env") == source.get("env")
        for key in ("bf16", "int8", "profile"):
            if key in copy["model"]:
                assert (SHIPPED_SPEC.parent / source["model"][key]).resolve() == \
                    (tmp_path / copy["model"][key]).resolve()


def test_demo_down_clears_the_demo_runs_checkpoints_and_nothing_else(tmp_path):
    """`make demo-down` then `make demo` on new nodes: the demo's run must start anew, not resume at its last step
    (refused: nothing left to train). Only the demo's runs go; the tests' and a user's own runs stay."""
    shared = tmp_path / "shared"
    for name in [*demo_runs(), "my-own-run", "tiny-cpu-sim", ".rollout8-images"]:
        (shared / name / "checkpoints").mkdir(parents=True)
        (shared / name / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3")
    (tmp_path / "twin").mkdir()
    twin = yaml.safe_load(bf16_twin(SHIPPED_SPEC, tmp_path / "twin").read_text())["name"]
    assert demo_runs() == [yaml.safe_load(SHIPPED_SPEC.read_text())["name"], twin]
    assert sorted(p.name for p in clear_demo_runs(shared)) == sorted(demo_runs())
    assert sorted(p.name for p in shared.iterdir()) == [".rollout8-images", "my-own-run", "tiny-cpu-sim"]
    assert clear_demo_runs(shared) == []  # again: nothing to do

