#!/usr/bin/python
"""The node's NPU network as hccn_tool reports it, judged on what the tool prints (Python 3.7 compatible).

hccn_tool often exits 0 with a bad answer: a link `DOWN`, a health other than `Success`, a ping that lost packets.
So every answer is parsed, and the verdict is read from the text, never from the return code alone.

- The tools: `npu_smi` and `hccn_tool` are the configured paths; empty means "find it": on PATH, else in the
  driver's known directories (KNOWN_DIRS; sudo's secure_path has none of the driver's). Not found, or a configured
  path that is not an executable file, fails naming the directories searched and the knob to set. The paths found
  are returned (`npu_smi`, `hccn_tool`).
- `checks: [local]`: for every device 0..devices-1, `hccn_tool -i N -link -g` must say `link status: UP`,
  `-net_health -g` must say `net health status: Success`, and `-ip -g` must give an `ipaddr:`. The devices' addresses
  are returned in `ips` (device i's at index i).
- `checks: [local]` also reads each device's TLS switch (`hccn_tool -i N -tls -g`: `tls switch[0](0:disable,
  1:enable)`), returned in `tls` ("enabled", "disabled", or "" where the driver gave no answer to read).
- `checks: [tls]`: `tls_by_node` (node name -> its `tls`) must hold one state: HCCL cannot link a TLS-enabled device
  with a disabled one, every ping passes and the link setup hangs. A mixed cluster fails naming each node's devices
  in each state and the command that sets one. Devices without an answer are left out.
- `checks: [ping]`: every rail: device i pings device i of every peer (`peers`: peer name -> its `ips`), and every
  ping must report all its packets received: any loss (a partial one too), a missing summary or a non-zero exit fails.

Each call to hccn_tool is bounded by `timeout` seconds; the pings of different rails run side by side. A failure is
one line naming the node, the device (rail) and what is wrong, with every device's parsed answer in `devices`.
Reads only: `changed` is always false, and check mode runs the same reads.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule

# Where the Ascend driver puts npu-smi and hccn_tool when they are not on PATH.
KNOWN_DIRS = ("/usr/local/bin", "/usr/local/sbin", "/usr/local/Ascend/driver/tools", "/usr/bin", "/usr/sbin")
KNOBS = {"npu-smi": "rollout8_npu_smi", "hccn_tool": "rollout8_hccn_tool"}

LINK = re.compile(r"link\s+status\s*:\s*(\S+)", re.I)
HEALTH = re.compile(r"net\s+health\s+status\s*:\s*(.+)", re.I)
IPADDR = re.compile(r"ipaddr\s*:\s*([0-9]{1,3}(?:\.[0-9]{1,3}){3})\b", re.I)
NETMASK = re.compile(r"netmask\s*:\s*([0-9]{1,3}(?:\.[0-9]{1,3}){3})\b", re.I)
TLS_SWITCH = re.compile(r"tls\s+switch\s*\[\s*([01])\s*\]", re.I)
PING_SUMMARY = re.compile(r"(\d+)\s+packets?\s+transmitted\s*,\s*(\d+)\s+received\s*,\s*([0-9.]+)\s*%\s*packet\s+loss",
                          re.I)


def find_tool(name, configured, path_env, dirs=KNOWN_DIRS):
    """(path, problem): the configured path when it is an executable file, else, when none is configured, `name` on
    `path_env` (a PATH string) or in `dirs`. problem is "" when found, else why not (without the node's name)."""
    knob = KNOBS.get(name, "its path")
    if configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            return configured, ""
        return "", "{}={} is not an executable file on this node; set {} to where {} is, or leave it empty to " \
                   "have it found".format(knob, configured, knob, name)
    found = shutil.which(name, path=path_env) if path_env else None
    if not found:
        found = shutil.which(name, path=os.pathsep.join(dirs))
    if found:
        return found, ""
    return "", "{} not found on PATH ({}) nor in {}; install the Ascend NPU driver, or set {} to its path".format(
        name, path_env or "empty", ", ".join(dirs), knob)


def first_line(text):
    """The first non-empty line of `text`, stripped ("" when there is none)."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def parse_link(text):
    """`link status: UP` -> "UP"; "" when the text says no link status."""
    match = LINK.search(text or "")
    return match.group(1) if match else ""


def parse_health(text):
    """`net health status: Success` -> "Success"; "" when the text says no health status."""
    match = HEALTH.search(text or "")
    return match.group(1).strip() if match else ""


def parse_ip(text):
    """`ipaddr:192.168.100.101` / `netmask:255.255.255.0` -> ("192.168.100.101", "255.255.255.0"); "" for each
    missing."""
    ip = IPADDR.search(text or "")
    mask = NETMASK.search(text or "")
    return (ip.group(1) if ip else ""), (mask.group(1) if mask else "")


def parse_tls(text):
    """`dev_id:0, tls switch[1](0:disable, 1:enable), ...` -> "enabled" ("disabled" for 0); "" when not said."""
    match = TLS_SWITCH.search(text or "")
    return ("enabled" if match.group(1) == "1" else "disabled") if match else ""


def device_spans(devices):
    """[0, 1, 2, 5] -> "devices 0-2, 5"; [3] -> "device 3"."""
    devices = sorted(set(devices))
    spans, start = [], None
    for i, device in enumerate(devices):
        if start is None:
            start = device
        if i + 1 == len(devices) or devices[i + 1] != device + 1:
            spans.append(str(start) if start == device else "{}-{}".format(start, device))
            start = None
    return ("device " if len(devices) == 1 else "devices ") + ", ".join(spans)


def tls_mixed(tls_by_node):
    """One line when the devices of `tls_by_node` (node -> [state of device 0, 1, ...]) are not all in one TLS
    state, naming every node's devices in each state; "" when they agree (unanswered devices left out)."""
    where = {}
    for node in sorted(tls_by_node):
        for device, state in enumerate(tls_by_node[node] or []):
            if state in ("enabled", "disabled"):
                where.setdefault(state, {}).setdefault(node, []).append(device)
    if len(where) < 2:
        return ""
    parts = ["{} on {}".format(state, ", ".join("{} {}".format(node, device_spans(devices))
                                                for node, devices in sorted(where[state].items())))
             for state in ("enabled", "disabled")]
    return ("NPU TLS switch (hccn_tool -i N -tls -g) differs between devices: {}. HCCL cannot link a TLS-enabled "
            "device with a disabled one: every ping passes and the link setup hangs. Set one state on every device "
            "of every node, e.g. on each node: for i in $(seq 0 7); do hccn_tool -i $i -tls -s enable 0; "
            "done".format("; ".join(parts)))


def parse_ping(text):
    """The summary of `hccn_tool -i N -ping -g address X`: `3 packets transmitted, 3 received, 0.00% packet loss` ->
    {"sent": 3, "received": 3, "loss_percent": 0.0}; None when there is no summary (the last one when several)."""
    found = PING_SUMMARY.findall(text or "")
    if not found:
        return None
    sent, received, loss = found[-1]
    try:
        loss_percent = float(loss)
    except ValueError:
        return None
    return {"sent": int(sent), "received": int(received), "loss_percent": loss_percent}


def call_problem(what, rc, out, timed_out=False, timeout=0):
    """Why one call of hccn_tool gave no answer to read, or ""."""
    if timed_out:
        return "{} did not answer within {} s".format(what, timeout)
    if rc != 0:
        return "{} exited {}{}".format(what, rc, ": " + first_line(out) if first_line(out) else "")
    return ""


def device_problems(answer, read=("link", "health", "ip")):
    """What is wrong with one device's local answers ({"link", "health", "ip"}; empty values when unparsed), judging
    only the answers in `read` (those whose call gave output to read)."""
    problems = []
    if "link" in read and answer.get("link", "").upper() != "UP":
        problems.append("link status {}, want UP".format(answer.get("link") or "not reported"))
    if "health" in read and answer.get("health", "").lower() != "success":
        problems.append("net health status {}, want Success".format(answer.get("health") or "not reported"))
    if "ip" in read and not answer.get("ip"):
        problems.append("no IP address (hccn_tool -ip -g gave no ipaddr)")
    return problems


def ping_problem(ping):
    """What is wrong with one ping ({"rc", "summary": parse_ping() or None, "first_line"}), or ""."""
    summary = ping.get("summary")
    if summary is None:
        text = " (exit {}{})".format(ping.get("rc"), ": " + ping["first_line"] if ping.get("first_line") else "")
        return "no ping summary (packets transmitted/received){}".format(text)
    if summary["sent"] == 0:
        return "no packet sent"
    if summary["received"] < summary["sent"] or summary["loss_percent"] > 0:
        return "{} of {} packets received, {:.2f}% packet loss".format(summary["received"], summary["sent"],
                                                                      summary["loss_percent"])
    if ping.get("rc", 0) != 0:
        return "hccn_tool exited {} although every packet came back".format(ping["rc"])
    return ""


def run(argv, timeout):
    """(rc, stdout + stderr, timed_out) of one bounded call."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.output if isinstance(exc.output, str) else (exc.output or b"").decode("utf-8", "replace")
        return -1, out, True
    except OSError as exc:
        return 127, str(exc), False
    return proc.returncode, proc.stdout, False


def check_device(tool, device, timeout):
    """One device's link, health and address: (answer, problems)."""
    answer = {"device": device, "link": "", "health": "", "ip": "", "netmask": "", "tls": ""}
    problems, read = [], []
    for flag, key in (("-link", "link"), ("-net_health", "health"), ("-ip", "ip")):
        rc, out, timed_out = run([tool, "-i", str(device), flag, "-g"], timeout)
        failed = call_problem("hccn_tool -i {} {} -g".format(device, flag), rc, out, timed_out, timeout)
        if failed:
            problems.append(failed)
            continue
        read.append(key)
        if key == "link":
            answer["link"] = parse_link(out)
        elif key == "health":
            answer["health"] = parse_health(out)
        else:
            answer["ip"], answer["netmask"] = parse_ip(out)
    # the TLS switch: read where the driver answers (older ones know no -tls); tls_mixed judges it across nodes
    rc, out, timed_out = run([tool, "-i", str(device), "-tls", "-g"], timeout)
    answer["tls"] = parse_tls(out) if not timed_out else ""
    return answer, problems + device_problems(answer, read)


def ping_rail(tool, device, peers, timeout):
    """Device `device` pings device `device` of every peer: (pings, problems)."""
    pings, problems = [], []
    for peer in sorted(peers):
        ips = peers[peer] or []
        address = ips[device] if device < len(ips) else ""
        if not address:
            problems.append("peer {} reported no address for device {}".format(peer, device))
            continue
        rc, out, timed_out = run([tool, "-i", str(device), "-ping", "-g", "address", address], timeout)
        summary = parse_ping(out)
        ping = {"peer": peer, "address": address, "rc": rc, "first_line": first_line(out), "summary": summary}
        found = "did not answer within {} s".format(timeout) if timed_out and summary is None else ping_problem(ping)
        result = {"peer": peer, "address": address, "rc": rc, "sent": None, "received": None, "loss_percent": None}
        if summary is not None:
            result.update(summary)
        pings.append(result)
        if found:
            problems.append("ping of {} (device {} of {}): {}".format(address, device, peer, found))
    return pings, problems


def one_line(node, what, problems):
    """The failure: '<node>: <what>: device 3 (rail 3): ...; device 5 (rail 5): ...' on one line."""
    parts = ["device {} (rail {}): {}".format(device, device, ", ".join(found)) for device, found in problems]
    return " ".join("{}: {}: {}".format(node, what, "; ".join(parts)).split())


def main():
    module = AnsibleModule(
        argument_spec={
            "npu_smi": {"type": "str", "default": None},
            "hccn_tool": {"type": "str", "default": ""},
            "devices": {"type": "int", "default": 0},
            "checks": {"type": "list", "elements": "str", "choices": ["local", "ping", "tls"], "default": []},
            "peers": {"type": "dict", "default": {}},
            "tls_by_node": {"type": "dict", "default": {}},
            "timeout": {"type": "int", "default": 30},
            "node": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    node = p["node"] or os.uname()[1]
    path_env = os.environ.get("PATH", "")
    result = {"changed": False, "node": node}
    names = [("npu-smi", "npu_smi")] if p["npu_smi"] is not None else []
    for name, key in names + [("hccn_tool", "hccn_tool")]:
        found, problem = find_tool(name, p[key] or "", path_env)
        if problem:
            module.fail_json(msg="{}: {}".format(node, problem), **result)
        result[key] = found
    tool = result["hccn_tool"]
    devices = range(max(p["devices"], 0))

    if "local" in p["checks"]:
        answers, problems = [], []
        for device in devices:
            answer, found = check_device(tool, device, p["timeout"])
            answers.append(answer)
            if found:
                problems.append((device, found))
        result["devices"] = answers
        result["ips"] = [answer["ip"] for answer in answers]
        result["tls"] = [answer["tls"] for answer in answers]
        if problems:
            module.fail_json(msg=one_line(node, "NPU network (hccn_tool)", problems), **result)

    if "tls" in p["checks"]:
        mixed = tls_mixed(dict((str(name), list(states or [])) for name, states in (p["tls_by_node"] or {}).items()))
        if mixed:
            module.fail_json(msg=mixed, **result)

    if "ping" in p["checks"]:
        peers = dict((str(name), list(ips or [])) for name, ips in (p["peers"] or {}).items())
        with ThreadPoolExecutor(max_workers=max(len(devices), 1)) as pool:
            rails = list(pool.map(lambda device: ping_rail(tool, device, peers, p["timeout"]), devices))
        result["pings"] = [{"device": device, "pings": rails[device][0]} for device in devices]
        problems = [(device, rails[device][1]) for device in devices if rails[device][1]]
        if problems:
            module.fail_json(msg=one_line(node, "NPU cross-node ping (hccn_tool)", problems), **result)

    module.exit_json(**result)


if __name__ == "__main__":
    main()
