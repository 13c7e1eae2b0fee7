#!/usr/bin/python
"""Whether the nodes reach each other on the ports the job uses, before anything is sent (Python 3.7 compatible:
it runs on the node's own Python). Three modes, run across the play's hosts one after the other:

- `listen`: a small listener, detached from the module, binds each of `ports` that is free (a port already held,
  by this run's Ray on a re-run, answers by itself) and one port the kernel picks from its ephemeral range (where
  torch's rendezvous and Gloo's connections land), accepts and closes connections, and exits after `seconds` at
  the latest. Records its pid and start time in `state` (a file; the start time, so `stop` never kills a recycled
  pid) and returns them with `bound`, `held` and `ephemeral`.
- `connect`: connects to every peer's address on its ports (`peers`: name -> {address, ports}), in parallel, each
  bounded by `timeout` seconds (a refusal is retried until then: the peer's listener may still be starting).
  Returns `missing`: [{peer, address, port, reason}] (not `unreachable`: Ansible reads that key as the host's).
- `stop`: ends the listener recorded in `state`, if it is still the one that started then, and removes the record
  (a preflight cut short, by a failure or Ctrl-C, leaves one that the next run's stop ends before its port check).
Reads and listens only; `changed` is always false.
"""


import json
import os
import select
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule


def start_time(pid):
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or "" if it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def bind(port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen(16)
    except OSError:
        sock.close()
        return None
    return sock


def serve(sockets, seconds):
    """Accept connections until the deadline (the listener's whole life), each closed once its peer has closed it:
    the side that closes first keeps the port in TIME-WAIT, and that must be the peer's ephemeral port, not the Ray
    port this listener borrows (Ray binds it minutes later)."""
    deadline = time.time() + seconds
    conns = []
    while time.time() < deadline:
        ready, _, _ = select.select(sockets + conns, [], [], max(0.0, min(1.0, deadline - time.time())))
        for sock in ready:
            try:
                if sock in sockets:
                    conns.append(sock.accept()[0])
                elif not sock.recv(64):
                    conns.remove(sock)
                    sock.close()
            except OSError:
                if sock in conns:
                    conns.remove(sock)
                    sock.close()
    for conn in conns:
        conn.close()


def listen(ports, seconds):
    """Bind in this process (so the result is known), then leave the serving to a detached grandchild."""
    sockets, bound, held = [], [], []
    for port in ports:
        sock = bind(port)
        if sock is None:
            held.append(port)
        else:
            sockets.append(sock)
            bound.append(port)
    ephemeral = bind(0)
    ephemeral_port = 0
    if ephemeral is not None:
        sockets.append(ephemeral)
        ephemeral_port = ephemeral.getsockname()[1]
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the first child: a new session, then the grandchild serves (nothing waits for it)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.write(write_end, ("%d %s\n" % (os.getpid(), start_time(os.getpid()))).encode())
        os.close(write_end)
        try:
            serve(sockets, seconds)
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    line = os.read(read_end, 100).decode().split()
    os.close(read_end)
    for sock in sockets:
        sock.close()  # the grandchild holds its own copies
    if not line:  # the grandchild died before it could say so: nothing listens
        return {"pid": 0, "started": "", "bound": [], "held": held, "ephemeral": 0}
    return {"pid": int(line[0]), "started": line[1] if len(line) > 1 else "", "bound": bound, "held": held,
            "ephemeral": ephemeral_port}


def reach(peer, address, port, timeout):
    deadline = time.time() + timeout
    reason = "timed out"
    while True:
        left = deadline - time.time()
        if left <= 0:
            return {"peer": peer, "address": address, "port": port, "reason": reason}
        try:
            socket.create_connection((address, port), timeout=left).close()
            return None
        except socket.timeout:
            reason = "timed out"
        except OSError as exc:
            reason = "refused" if isinstance(exc, ConnectionRefusedError) else (exc.strerror or str(exc))
            time.sleep(min(0.2, max(0.0, deadline - time.time())))


def connect(peers, timeout):
    jobs = [(name, peer["address"], int(port)) for name, peer in sorted(peers.items()) for port in peer["ports"]]
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(jobs))) as pool:
        results = list(pool.map(lambda job: reach(job[0], job[1], job[2], timeout), jobs))
    return [result for result in results if result is not None]


def record(state, listener):
    directory = os.path.dirname(state)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory)
    with open(state, "w") as handle:
        json.dump({"pid": listener["pid"], "started": listener["started"]}, handle)


def stop(state):
    """End the recorded listener (waiting, bounded, until its ports are free) and remove the record."""
    try:
        with open(state) as handle:
            recorded = json.load(handle)
    except (OSError, ValueError):
        return False
    pid, started = int(recorded.get("pid", 0)), str(recorded.get("started", ""))
    stopped = False
    if pid > 0 and started and start_time(pid) == started:
        try:
            os.kill(pid, signal.SIGTERM)
            stopped = True
        except OSError:
            pass
        for _ in range(50):  # at most 5 s
            if start_time(pid) != started:
                break
            time.sleep(0.1)
    os.remove(state)
    return stopped


def main():
    module = AnsibleModule(argument_spec={
        "mode": {"type": "str", "required": True, "choices": ["listen", "connect", "stop"]},
        "ports": {"type": "list", "elements": "int", "default": []},
        "seconds": {"type": "int", "default": 120},
        "peers": {"type": "dict", "default": {}},
        "timeout": {"type": "float", "default": 3.0},
        "state": {"type": "path", "default": "/run/rollout8-port-probe.json"},
    }, supports_check_mode=True)
    params = module.params
    if params["mode"] == "listen":
        stop(params["state"])  # one listener per node at a time
        listener = listen(params["ports"], params["seconds"])
        if listener["pid"]:
            record(params["state"], listener)
        module.exit_json(changed=False, **listener)
    if params["mode"] == "connect":
        module.exit_json(changed=False, missing=connect(params["peers"], params["timeout"]))
    module.exit_json(changed=False, stopped=stop(params["state"]))


if __name__ == "__main__":
    main()
