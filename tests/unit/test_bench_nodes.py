"""bench/bench_nodes.py's pure logic: play groups from the callback's record, growth with the node count, the rows,
the run spec per size, and the model of bare nodes -> first step (docs/benchmarks.md, "The cost of N nodes").

No container is started and no time is measured: the records and times are made up.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def nodes():
    spec = importlib.util.spec_from_file_location("bench_nodes_under_test", REPO / "bench" / "bench_nodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # as bench/run.py loads it: outside sys.modules
    return module


def _record(nodes, seconds: float = 1.0, reach: float = 0.5) -> list[dict]:
    """A callback record with every play of the groups and the timed tasks, role-prefixed as Ansible names them."""
    plays = [{"play": name, "seconds": seconds, "tasks": []} for names in nodes.PLAY_GROUPS.values() for name in names]
    for play, tasks in nodes.TASK_GROUPS.values():
        record = next(p for p in plays if p["play"] == play)
        record["tasks"] = [{"task": f"role : {task}", "seconds": reach} for task in tasks]
        record["tasks"].append({"task": "role : something else", "seconds": 100.0})
    plays.append({"play": "Training image on every node", "seconds": 50.0, "tasks": []})
    return plays


def test_node_names_head_first(nodes):
    assert nodes.node_names(3) == ["rollout8-bench-n01", "rollout8-bench-n02", "rollout8-bench-n03"]
    assert len(set(nodes.node_names(16))) == 16
    assert not any(name.startswith("rollout8-sim") for name in nodes.node_names(16) + [nodes.BASTION, nodes.NETWORK])


def test_group_times_sums_plays_and_named_tasks_only(nodes):
    times = nodes.group_times(_record(nodes), total=42.0)
    assert times["validation"] == 2.0  # its two plays
    assert times["facts"] == times["preflight"] == times["artifacts"] == 1.0
    assert times["reach"] == 0.5 * len(nodes.TASK_GROUPS["reach"][1])  # not the other task of the play
    assert times["arrival check"] == 0.5
    assert times["total"] == 42.0


def test_group_times_refuses_a_renamed_play_or_task(nodes):
    plays = [p for p in _record(nodes) if p["play"] != nodes.PLAY_GROUPS["preflight"][0]]
    with pytest.raises(ValueError, match="preflight"):
        nodes.group_times(plays, total=1.0)
    plays = _record(nodes)
    reach = nodes.TASK_GROUPS["reach"][1]
    for p in plays:
        p["tasks"] = [t for t in p["tasks"] if t["task"].split(" : ", 1)[-1] not in reach]
    with pytest.raises(ValueError, match="reach"):
        nodes.group_times(plays, total=1.0)


def test_growth_linear_is_not_superlinear(nodes):
    g = nodes.growth({1: 10.0, 4: 13.0, 8: 17.0, 16: 25.0})  # 9 s fixed + 1 s a node
    assert g[4]["ratio"] == pytest.approx(1.3)
    assert g[16]["per_node"] == pytest.approx(25 / 16)
    assert g[16]["per_added_node"] == pytest.approx(1.0)
    assert g[1]["per_added_node"] is None
    assert not any(v["superlinear"] for v in g.values())


def test_growth_flags_faster_than_the_node_count(nodes):
    g = nodes.growth({2: 1.0, 4: 2.0, 8: 5.0})  # doubles to 4 (linear), then 2.5x for 2x the nodes
    assert not g[4]["superlinear"]
    assert g[8]["superlinear"]
    assert g[8]["ratio"] == 5.0


def test_rows_compare_against_the_smallest_size_a_group_runs_at(nodes):
    first = {group: {1: 10.0, 4: 12.0, 8: 14.0} for _, group, _, _ in nodes.ROW_GROUPS}
    first["reach"] = {1: 0.1, 4: 1.0, 8: 3.0}  # skipped on one node; superlinear from 4 to 8
    again = {group: dict(times) for group, times in first.items()}
    rows = nodes.rows(first, again)
    reach = [r for r in rows if r["name"].startswith("preflight's all-pairs reachability")]
    assert [(r["a"], r["b"], r["b_label"]) for r in reach] == [(3.0, 1.0, "4 nodes")]
    assert "SUPERLINEAR" in reach[0]["note"]
    facts = [r for r in rows if r["name"].startswith("facts play")]
    assert [(r["a_label"], r["a"], r["b"]) for r in facts] == [("4 nodes", 12.0, 10.0), ("8 nodes", 14.0, 10.0)]
    assert all("SUPERLINEAR" not in r["note"] for r in facts)
    assert "1.75 s per node at 8" in facts[1]["note"]


def test_fit_recovers_a_line(nodes):
    fixed, per_node = nodes.fit({1: 12.0, 4: 18.0, 8: 26.0, 16: 42.0})
    assert fixed == pytest.approx(10.0)
    assert per_node == pytest.approx(2.0)


def _site(nodes, **changes):
    values = {"plays_fixed_s": 10.0, "plays_per_node_s": 1.0, "image_gb": 20.0, "load_gb_s": 0.1,
              "link_gb_s": 1.0, "store_gb_s": 1.0, "start_s": 100.0}
    return nodes.Site(**{**values, **changes})


def test_model_parallel_loads_bound_by_the_node_then_by_the_storage(nodes):
    small = nodes.first_step_model(4, _site(nodes))  # 4 x 20 GB at 1 GB/s = 80 s < one load of 200 s
    assert small["terms"]["loads: one node's load"] == pytest.approx(200.0)
    assert small["terms"]["node-facing plays"] == pytest.approx(14.0)
    assert small["terms"]["image sent once"] == pytest.approx(20.0)
    assert small["terms"]["image saved (or pushed) once"] == 0.0
    assert small["total"] == pytest.approx(14 + 20 + 200 + 100)
    pushed = nodes.first_step_model(4, _site(nodes, prepare_s_per_gb=10.0, link_gb_s=math.inf))
    assert pushed["terms"]["image saved (or pushed) once"] == pytest.approx(200.0)
    assert pushed["terms"]["image sent once"] == 0.0
    assert small["dominant"] == "loads: one node's load"
    big = nodes.first_step_model(64, _site(nodes))  # 64 x 20 GB at 1 GB/s = 1280 s
    assert big["terms"]["loads: the storage serving every node's copy"] == pytest.approx(1280.0)
    assert big["dominant"] == "loads: the storage serving every node's copy"


def test_model_throttled_loads_run_in_waves(nodes):
    model = nodes.first_step_model(64, _site(nodes, load_throttle=8))  # 8 waves of max(200 s, 8 x 20 s = 160 s)
    assert model["terms"]["loads: one node's load"] == pytest.approx(8 * 200.0)
    one = nodes.first_step_model(3, _site(nodes, load_throttle=8))  # fewer nodes than the throttle: one wave
    assert one["terms"]["loads: one node's load"] == pytest.approx(200.0)
    assert math.isclose(sum(one["terms"].values()), one["total"])


def test_spec_per_size_keeps_the_base_and_one_file(nodes, tmp_path):
    base = tmp_path / "sim-run.yaml"
    base.write_text(yaml.safe_dump({"name": "tiny-cpu-sim", "cluster": {"nnodes": 3, "npus_per_node": 1},
                                    "deploy": {"root": "/var/lib/rollout8/runs/tiny-cpu-sim"},
                                    "model": {"bf16": "tiny/bf16"},
                                    "verl": {"data.train_batch_size": 6, "trainer.experiment_name": "x"}}))
    four = nodes._spec(base, 4)
    sixteen = nodes._spec(base, 16)
    assert four == sixteen == tmp_path / "bench-nodes.yaml"  # one plan directory for every size
    spec = yaml.safe_load(sixteen.read_text())
    assert spec["cluster"] == {"nnodes": 16, "npus_per_node": 1, "shared_dir": nodes.SHARED_DIR}
    assert spec["model"] == {"bf16": "tiny/bf16"}  # relative to the base's directory, where the file is written
    assert spec["verl"]["data.train_batch_size"] % 16 == 0
    assert spec["name"] != "tiny-cpu-sim" and spec["deploy"]["root"].endswith(spec["name"])
