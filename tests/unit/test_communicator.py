"""A rank that has not joined its communicator is named (issue 26, part 7): every rank says when it waits and when
it joined (rollout8.node.communicator, wrapping torch.distributed.init_process_group as activation does in every
verl process), and `rollout8 progress` names the ranks that never arrived, the node short of them and its devices.

The wrapper runs around the real torch.distributed (gloo over loopback, as verl's `cpu:gloo` part connects every
rank inside init_process_group) in separate processes; the progress side reads those real lines, as Ray forwards
them into a driver log with its `(WorkerDict pid=N, ip=A)` prefix."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from rollout8.results import communicator
from rollout8.results.progress import progress_line, read_progress

REPO = Path(__file__).resolve().parents[2]

RANK = """
import datetime, sys
from rollout8.node import communicator
assert communicator.watch() == "yes"
import torch.distributed as dist
rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=int(sys.argv[4])))
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_rank(rank: int, world: int, port: int, timeout_s: int, device: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(world), str(port), str(timeout_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO / "src"), "ASCEND_RT_VISIBLE_DEVICES": device,
                                 **env})


def marked(proc: subprocess.Popen) -> list[str]:
    _, err = proc.communicate(timeout=120)
    return [line for line in err.splitlines() if communicator.MARKER in line]


def test_ranks_that_all_arrive_say_waiting_then_joined():
    port = free_port()
    procs = [start_rank(r, 2, port, 60, str(r)) for r in range(2)]
    lines = [marked(p) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], lines
    for rank, said in enumerate(lines):
        assert [line.split("state=")[1].split()[0] for line in said] == ["waiting", "joined"], said
        assert f"rank={rank} world=2" in said[0] and f"device={rank}" in said[0] and "backend=gloo" in said[0]
        assert f"master=127.0.0.1:{port}" in said[0] and f"node={socket.gethostname()}" in said[0]
    groups = communicator.read_groups(lines[0] + lines[1])
    assert len(groups) == 1 and groups[0].all_joined and groups[0].joined == [0, 1]
    assert communicator.problems(groups, now=1e12) == []


def test_a_rank_left_alone_says_it_still_waits_then_fails_and_progress_names_the_missing_rank(tmp_path):
    """Rank 0 of 2 alone (rank 1 never started): it says `still-waiting` every ROLLOUT8_COMMUNICATOR_WARN_S and
    `failed` with gloo's error at the group's timeout; progress names rank 1 and the node short of it."""
    proc = start_rank(0, 2, free_port(), 4, "0", ROLLOUT8_COMMUNICATOR_WARN_S="1")
    said = marked(proc)
    assert proc.returncode != 0
    states = [line.split("state=")[1].split()[0] for line in said]
    assert states[0] == "waiting" and states[-1] == "failed" and "still-waiting" in states, said
    assert "error=" in said[-1] and "waited_s=" in said[-1]

    # in a driver log as Ray forwards it, while rank 0 still waits (its failure not yet logged)
    log = tmp_path / "driver.log"
    log.write_text("".join(f"(WorkerDict pid=7, ip=10.1.0.1) {line}\n" for line in said[:-1]))
    started = float(said[0].rsplit("t=", 1)[1])
    early = read_progress(log, 4, now=started + 10, after_s=180, npus_per_node=2)
    assert early.communicator == [] and early.joined == "0 of 2"
    late = read_progress(log, 4, now=started + 200, after_s=180, npus_per_node=2,
                         nodes=[f"{socket.gethostname()}=10.1.0.1"])
    assert len(late.communicator) == 1, late.communicator
    line = late.communicator[0]
    assert line.startswith("communicator not complete (0 of 2 ranks joined): rank 1 of 2 never reached it"), line
    assert f"{socket.gethostname()} (10.1.0.1) is short of 1: device 1" in line, line
    assert "1 rank" in line and "has waited 3m20s for all 2 to connect to 127.0.0.1:" in line and "(gloo)" in line
    assert progress_line("j", "RUNNING", late).endswith(line)

    # the whole log: the failure and gloo's error, named with the rank
    log.write_text("".join(f"(WorkerDict pid=7, ip=10.1.0.1) {line}\n" for line in said))
    ended = read_progress(log, 4, now=started + 10, after_s=180)
    assert "rank 0 (" in ended.communicator[0] and "device 0) failed after" in ended.communicator[0]


def test_a_node_that_sent_nothing_is_named_from_the_cluster_list():
    lines = [f"(WorkerDict pid={10 + r}, ip=10.1.0.1) {communicator.MARKER} state=waiting rank={r} world=4 "
             f"node=head device={r} backend=cpu:gloo,npu:hccl master=10.1.0.1:29500 t=100.0" for r in range(2)]
    groups = communicator.read_groups(lines)
    said = communicator.problems(groups, now=400.0, npus_per_node=2, nodes=["head=10.1.0.1", "w1=10.1.0.2"])
    assert said == ["communicator not complete (0 of 4 ranks joined): ranks 2-3 of 4 never reached it; "
                    "w1 (10.1.0.2) sent nothing (is its Ray node in the cluster? `ray status` on the head); "
                    "2 ranks (head (10.1.0.1)) have waited 5m00s for all 4 to connect to 10.1.0.1:29500 "
                    "(cpu:gloo,npu:hccl)"], said


def test_progress_cli_prints_the_communicator_line(tmp_path):
    job = tmp_path / "rollout8-x-1"
    job.mkdir()
    (job / "driver.log").write_text(
        f"{communicator.MARKER} state=waiting rank=0 world=2 node=head device=0 backend=gloo master=h:1 t=1.0\n")
    proc = subprocess.run([sys.executable, "-m", "rollout8", "progress", str(job), "--json", "--state", "RUNNING",
                           "--npus-per-node", "2", "--communicator-after", "60"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["joined"] == "0 of 2" and out["communicator"] and "rank 1 of 2 never reached it" in out["line"]
    assert "head is short of 1: device 1" in out["line"], out["line"]


def test_the_device_is_the_one_ray_made_visible_or_the_one_local_rank_picks(monkeypatch):
    from rollout8.node.communicator import _device

    for visible, local, device in [("3", "0", "3"), ("0,1,2,3,4,5,6,7", "5", "5"), ("4,5,6,7", "1", "5"),
                                   ("", "2", "2"), ("", "", "-"), ("4,5", "", "4")]:
        monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", visible)
        monkeypatch.setenv("LOCAL_RANK", local)
        assert _device() == device, (visible, local)


def test_lines_ray_folded_or_reordered_in_the_driver_log_are_read_from_the_worker_logs(tmp_path):
    """Ray's driver log folds lines that differ only in words with digits ("[repeated 2x across cluster]") and
    prints forwarded lines out of order (seen in the demo: a rank's `joined` before its `waiting`, two ranks'
    `joined` folded into one); the worker logs the verify play collects per node have every line."""
    def line(rank: int, state: str, t: float, waited: str = "") -> str:
        return (f"{communicator.MARKER} state={state} rank={rank} world=3 node=rollout8-sim-w{rank} device=0 "
                f"backend=cpu:gloo master=10.0.0.1:4{waited} t={t}")

    job = tmp_path / "job"
    for rank in range(3):
        logs = job / f"rollout8-sim-w{rank}" / "logs"
        logs.mkdir(parents=True)
        (logs / f"worker-abc-02000000-{rank}.err").write_text(
            f"noise\n{line(rank, 'waiting', 10.0 + rank)}\n{line(rank, 'joined', 12.5, ' waited_s=1.0')}\n")
    (job / "driver.log").write_text(
        f"(WorkerDict pid=2, ip=10.0.0.3) {line(2, 'joined', 12.5, ' waited_s=1.0')}\n"
        f"(WorkerDict pid=2, ip=10.0.0.3) {line(2, 'waiting', 12.0)}\n"
        f"(WorkerDict pid=1, ip=10.0.0.2) {line(1, 'joined', 12.5, ' waited_s=1.0')} [repeated 2x across cluster]\n")
    only_driver = communicator.read_groups(communicator.marked_lines(job / "driver.log"))
    assert only_driver[0].joined == [1, 2]  # what the driver log alone shows: rank 0's line was folded away
    groups = communicator.read(job / "driver.log")
    assert [(g.world, g.joined) for g in groups] == [(3, [0, 1, 2])]
    progress = read_progress(job / "driver.log", now=1e6, npus_per_node=1)
    assert progress.joined == "3 of 3" and progress.communicator == []


def test_no_reminder_is_said_after_the_call_failed(monkeypatch):
    """Seen as a flaky failure of the test above: a reminder due just as the group's timeout ended was said after
    `failed`, so a rank's last word read `still-waiting`. Here the call fails while a reminder is being said; the
    order must stay waiting, still-waiting, failed (`_say` records when it is done, as a line written while another
    is written)."""
    from rollout8.node import communicator as node

    monkeypatch.setenv(node.WARN_ENV, "0.01")
    said, reminding = [], threading.Event()

    def say(state, fields, started, extra=""):
        if state == "still-waiting":
            reminding.set()
            time.sleep(0.2)
        said.append(state)

    monkeypatch.setattr(node, "_say", say)

    def init_process_group(**kwargs):
        assert reminding.wait(10)
        raise RuntimeError("Connection closed by peer")

    watched = node.wrap(init_process_group)
    try:
        watched(backend="gloo", rank=0, world_size=2)
    except RuntimeError:
        pass
    time.sleep(0.3)  # any reminder still due would be said by now
    assert said == ["waiting", "still-waiting", "failed"], said
