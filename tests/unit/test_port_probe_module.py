"""ansible/library/rollout8_port_probe.py, run as Ansible runs it (a subprocess given ANSIBLE_MODULE_ARGS) on
loopback: the listener binds what is free, reports what was held, serves after the module returned, and ends when
stopped or at its deadline; connect names each port that does not answer. The dropped-by-a-firewall case (a
timeout, not a refusal) is the simulated cluster's: tests/cluster/test_demo_runtime.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

MODULE_PATH = Path(__file__).resolve().parents[2] / "ansible" / "library" / "rollout8_port_probe.py"


def run(tmp_path: Path, **params) -> dict:
    args = tmp_path / f"args-{time.monotonic_ns()}.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
    proc = subprocess.run([sys.executable, str(MODULE_PATH), str(args)], capture_output=True, text=True, timeout=60)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["changed"] is False, out
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def gone(port: int, seconds: float) -> bool:
    """Whether port stops answering within seconds (bounded polling)."""
    for _ in range(int(seconds * 10)):
        if not answers(port):
            return True
        time.sleep(0.1)
    return False


def test_the_listener_binds_what_is_free_serves_after_the_module_returned_and_stops(tmp_path):
    held = socket.socket()
    held.bind(("0.0.0.0", 0))
    held.listen(1)
    taken = held.getsockname()[1]
    free = free_port()
    try:
        state = str(tmp_path / "probe.json")
        listener = run(tmp_path, mode="listen", ports=[free, taken], seconds=60, state=state)
        assert listener["bound"] == [free] and listener["held"] == [taken], listener
        assert listener["pid"] > 0 and listener["ephemeral"] > 0, listener
        peers = {"self": {"address": "127.0.0.1", "ports": [free, taken, listener["ephemeral"]]}}
        assert run(tmp_path, mode="connect", peers=peers, timeout=2)["missing"] == []
        # a recorded pid that now belongs to another process (another start time) is never killed
        Path(state).write_text(json.dumps({"pid": listener["pid"], "started": "1"}))
        assert run(tmp_path, mode="stop", state=state)["stopped"] is False and answers(free)
        assert not Path(state).exists()
        Path(state).write_text(json.dumps({"pid": listener["pid"], "started": listener["started"]}))
        # a peer slower to close than the listener is to accept (a remote node): the listener waits for its close,
        # so the TIME-WAIT lands on the peer's ephemeral port, never on the Ray port the listener borrowed
        slow = socket.create_connection(("127.0.0.1", free), timeout=2)
        time.sleep(0.5)
        slow.close()
        time.sleep(0.2)
        assert run(tmp_path, mode="stop", state=state)["stopped"] is True
        assert gone(free, 10)
        rebind = socket.socket()  # as a service binds it next, without SO_REUSEADDR
        try:
            rebind.bind(("0.0.0.0", free))
        finally:
            rebind.close()
        assert run(tmp_path, mode="stop", state=state)["stopped"] is False  # nothing recorded: nothing to do
        missing = run(tmp_path, mode="connect", peers=peers, timeout=1)["missing"]
        assert {(m["peer"], m["port"], m["reason"]) for m in missing} == {
            ("self", free, "refused"), ("self", listener["ephemeral"], "refused")}, missing
    finally:
        held.close()


def test_the_listener_ends_by_itself_at_its_deadline(tmp_path):
    port = free_port()
    listener = run(tmp_path, mode="listen", ports=[port], seconds=1, state=str(tmp_path / "probe.json"))
    assert listener["bound"] == [port]
    assert gone(port, 15), "the listener outlived its deadline"


def test_a_new_listener_ends_the_one_an_interrupted_run_left(tmp_path):
    port, state = free_port(), str(tmp_path / "probe.json")
    first = run(tmp_path, mode="listen", ports=[port], seconds=60, state=state)
    second = run(tmp_path, mode="listen", ports=[port], seconds=60, state=state)
    try:
        assert first["bound"] == [port] and second["bound"] == [port] and second["held"] == [], second
    finally:
        run(tmp_path, mode="stop", state=state)
    assert gone(port, 10)


def test_connect_with_no_peers_is_empty(tmp_path):
    assert run(tmp_path, mode="connect", peers={})["missing"] == []
