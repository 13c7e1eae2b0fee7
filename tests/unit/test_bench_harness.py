"""bench/run.py's logic (discovery, selection, row checks, ratios, table, JSON) with tiny fake benchmarks.

No timing is asserted: the fake benchmarks return fixed numbers.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("bench_run_under_test", REPO / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAKE = '''
from pathlib import Path
SEEN = []

def bench(work_dir: Path) -> list[dict]:
    assert work_dir.is_dir()
    (work_dir / "scratch").write_text("x")
    return [
        {"name": "copy", "a_label": "ours", "a": 30.0, "b_label": "theirs", "b": 10.0, "unit": "GB/s"},
        {"name": "mem", "a_label": "ours", "a": 1, "b_label": "theirs", "b": 4, "unit": "GiB", "note": "peak"},
    ]
'''


def _write(bench_dir: Path, name: str, text: str) -> None:
    bench_dir.mkdir(exist_ok=True)
    (bench_dir / f"bench_{name}.py").write_text(text)


def test_rows_ratios_table_and_json(harness, tmp_path, capsys):
    bench_dir = tmp_path / "bench"
    _write(bench_dir, "fake", FAKE)
    _write(bench_dir, "other", FAKE.replace("30.0", "99.0"))
    out = tmp_path / "results" / "latest.json"
    code = harness.main(["--bench-dir", str(bench_dir), "--only", "fake", "--out", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    assert [r["bench"] for r in results["rows"]] == ["fake", "fake"]  # --only left `other` out
    assert [r["ratio"] for r in results["rows"]] == [3.0, 0.25]
    assert results["rows"][1]["note"] == "peak" and results["errors"] == {}
    machine = results["machine"]
    assert machine["cores"] >= 1 and machine["python"] and machine["cpu"] and machine["ram_gib"] > 0
    assert "torch" in machine
    printed = capsys.readouterr().out
    assert "ours: 30 GB/s" in printed and "theirs: 10 GB/s" in printed and "3x" in printed and "0.25x" in printed
    md = out.with_suffix(".md").read_text()
    assert "| copy | ours: 30 GB/s | theirs: 10 GB/s | 3x |" in md and "- ours vs theirs: peak" in md


def test_only_accepts_the_file_stem_and_all_run_by_default(harness, tmp_path):
    bench_dir = tmp_path / "bench"
    _write(bench_dir, "fake", FAKE)
    _write(bench_dir, "other", FAKE)
    out = tmp_path / "r.json"
    assert harness.main(["--bench-dir", str(bench_dir), "--only", "bench_other", "--out", str(out)]) == 0
    assert {r["bench"] for r in json.loads(out.read_text())["rows"]} == {"other"}
    assert harness.main(["--bench-dir", str(bench_dir), "--out", str(out)]) == 0
    assert {r["bench"] for r in json.loads(out.read_text())["rows"]} == {"fake", "other"}


def test_unknown_name_is_an_error(harness, tmp_path, capsys):
    bench_dir = tmp_path / "bench"
    _write(bench_dir, "fake", FAKE)
    assert harness.main(["--bench-dir", str(bench_dir), "--only", "nope", "--out", str(tmp_path / "r.json")]) == 2
    assert "--only nope: no such benchmark (have: fake)" in capsys.readouterr().err


def test_broken_benchmarks_are_reported_and_the_rest_still_run(harness, tmp_path, capsys):
    bench_dir = tmp_path / "bench"
    _write(bench_dir, "a_raises", "def bench(work_dir):\n    raise RuntimeError('no NPU here')\n")
    _write(bench_dir, "b_bad_row", "def bench(work_dir):\n    return [{'name': 'x', 'a': 1.0}]\n")
    _write(bench_dir, "c_no_function", "X = 1\n")
    _write(bench_dir, "d_good", FAKE)
    out = tmp_path / "r.json"
    assert harness.main(["--bench-dir", str(bench_dir), "--out", str(out)]) == 1
    results = json.loads(out.read_text())
    assert results["errors"]["a_raises"] == "RuntimeError: no NPU here"
    assert "missing 'a_label'" in results["errors"]["b_bad_row"]
    assert "defines no bench(work_dir) function" in results["errors"]["c_no_function"]
    assert [r["bench"] for r in results["rows"]] == ["d_good", "d_good"]
    assert "bench_a_raises failed" in capsys.readouterr().err


def test_zero_denominator_gives_no_ratio(harness):
    rows = harness.check_rows("z", [{"name": "n", "a_label": "a", "a": 1.0, "b_label": "b", "b": 0.0, "unit": "s"}])
    assert rows[0]["ratio"] is None
    assert "a/b" in harness.table(rows) and " - " not in harness.table(rows).splitlines()[0]
    with pytest.raises(harness.BenchError, match="'a' is str"):
        harness.check_rows("z", [{"name": "n", "a_label": "a", "a": "1", "b_label": "b", "b": 1.0, "unit": "s"}])


def test_benchmark_without_rows_is_skipped_not_failed(harness, tmp_path, capsys):
    bench_dir = tmp_path / "bench"
    _write(bench_dir, "fake", FAKE)
    _write(bench_dir, "absent", "def bench(work_dir):\n    print('engine venv absent')\n    return []\n")
    out = tmp_path / "latest.json"
    code = harness.main(["--bench-dir", str(bench_dir), "--out", str(out)])
    results = json.loads(out.read_text())
    assert code == 0 and results["errors"] == {}
    assert results["skipped"] == ["absent"]
    assert "bench_absent: skipped" in capsys.readouterr().out
    _write(bench_dir, "broken", "def bench(work_dir):\n    return {'not': 'a list'}\n")
    assert harness.main(["--bench-dir", str(bench_dir), "--only", "broken", "--out", str(out)]) == 1


def test_benches_reach_the_nodes_as_the_inventory_says_bastion_included(tmp_path):
    """bench_dist's rsync and every ssh of a bench come from the inventory's own settings (sim_nodes.inventory_ssh):
    a command line of their own timed out once the nodes took ssh from the bastion only."""
    import shlex

    import simcluster

    key = tmp_path / "ssh" / "id_ed25519"
    key.parent.mkdir()
    inventory = simcluster.write_inventory(tmp_path / "inv", {"h": "172.28.0.2", "w": "172.28.0.3"}, key,
                                           bastion="172.28.0.9")
    argv = simcluster.inventory_ssh(inventory)
    assert sorted(argv) == ["h", "w"] and argv["w"][-1] == "172.28.0.3"
    assert f"ProxyJump={simcluster.BASTION}" in argv["h"] and "-F" in argv["h"] and str(key) in argv["h"]
    assert argv["h"][argv["h"].index("-l") + 1] == simcluster.NODE_USER
    rsh, addresses = simcluster.rsync_over_inventory(inventory)
    assert addresses == {"h": "172.28.0.2", "w": "172.28.0.3"}
    assert shlex.split(rsh) == argv["h"][:-1]
    text = (REPO / "bench" / "bench_dist.py").read_text() + (REPO / "bench" / "bench_cluster.py").read_text()
    assert "ssh -i" not in text and "bastion=" in text


def test_quick_runs_every_part_small_and_says_so_to_each(harness, tmp_path, monkeypatch):
    """`make bench-quick` (--quick): each module reads ROLLOUT8_BENCH_QUICK and shrinks its sizes; the real benches
    do (bench_cluster's node counts, bench_dist's and bench_image's bytes, the repetitions)."""
    monkeypatch.setenv(harness.QUICK_ENV, "0")  # restored (removed) after the test, whatever main() sets
    _write(tmp_path / "b", "probe", "import os\n\ndef bench(work_dir):\n    return [{'name': 'q', 'a_label': 'a', "
           "'a': float(os.environ.get('ROLLOUT8_BENCH_QUICK') == '1'), 'b_label': 'b', 'b': 1.0, 'unit': 'x'}]\n")
    out = tmp_path / "r.json"
    assert harness.main(["--bench-dir", str(tmp_path / "b"), "--out", str(out), "--quick"]) == 0
    assert json.loads(out.read_text())["rows"][0]["a"] == 1.0
    for name in ("cluster", "dist", "image", "quantizer", "reload", "profile"):
        assert "ROLLOUT8_BENCH_QUICK" in (REPO / "bench" / f"bench_{name}.py").read_text(), name
