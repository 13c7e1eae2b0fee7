#!/usr/bin/python
"""Ray's dashboard HTTP APIs, asked from the node itself (the head): standard library only, no Ray client.

Runs on the node's own Python before or beside anything rollout8 installs (keep it Python 3.7 compatible). The
dashboard listens on the head's loopback by default (`url`: rollout8_ray_api); the training container shares the
host's network, so the host reaches it there too.

`what`:
- `nodes`: the alive nodes and the NPU custom resource each offers: `nodes` = {node ip: NPU count}, and
  `duplicates`, the addresses Ray lists more than one alive node at (a restarted raylet's old entry, until Ray's
  health check marks it dead). An unreachable dashboard is not a failure (the caller waits): `reachable` says
  whether it answered.
- `job`: a Ray job's `status` (NONE for an id Ray does not know, or an empty id), `start_time` (seconds since the
  epoch: the logs collected are those written since) and, while it runs, `last_step`: the last verl training step
  its driver log shows (None if none yet). With `logs_dir` (Ray's temp directory on this node), read from the tail
  of Ray's driver log file there (the last MiB, then 16 and 256 MiB until a step line is found): a poll costs the
  same on a multi-gigabyte log as on a new one. Without it, or without the file, Ray's job API sends the whole log.
- `job_logs`: the job's driver log as `logs` (the verify play keeps it on the controller).

With `state_file` (the launch role's record of the run's current submission), `job` reads the job id there at
every call: a job the head's keeper (rollout8.node.keeper) resubmitted is followed under its new id. With
`keeper_dir` (the run directory holding keeper.json and keeper-status.json), a job that FAILED, or that Ray no
longer knows, while the keeper is on and alive (its status written in the last KEEPER_ALIVE_S seconds) is
`RESUMING` until the keeper has resubmitted it or given up (`keeper`: its status, attempts and reason).

Nothing changes on the node: `changed` is always false.
"""


import glob
import json
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.six.moves.urllib.request import urlopen

# verl's console logger: `step:12 - ... - timing_s/step:3.4 ...` (not a path segment such as `global_step:`)
STEP = re.compile(r"(?<![\w/])step:(\d+) - .*timing_s/step:")
KEEPER_ALIVE_S = 60  # the keeper writes its status every few seconds; older: it is not running


def get(url, timeout):
    response = urlopen(url, timeout=timeout)
    try:
        return json.loads(response.read().decode("utf-8", "replace"))
    finally:
        response.close()


def nodes(base, timeout):
    try:
        data = get(base + "/api/v0/nodes?limit=10000", timeout)
    except (URLError, OSError, ValueError) as exc:
        return {"reachable": False, "nodes": {}, "error": str(exc)}
    found, seen = {}, {}
    for node in data["data"]["result"]["result"]:
        if node.get("state") == "ALIVE":
            found[node["node_ip"]] = node.get("resources_total", {}).get("NPU", 0)
            seen[node["node_ip"]] = seen.get(node["node_ip"], 0) + 1
    # an address with two alive nodes: a raylet killed and started again there (by the play, or by the training
    # container's keeper), whose old entry Ray's health check has not marked dead yet (seconds); a job started
    # meanwhile counts the node twice
    return {"reachable": True, "nodes": found, "duplicates": sorted(ip for ip, n in seen.items() if n > 1)}


def tail_step(logs_dir, job_id):
    """The last training step in the tail of Ray's driver log file under logs_dir, None if none there, or False
    when there is no such file."""
    found = glob.glob(os.path.join(logs_dir, "session_*", "logs", "job-driver-%s.log" % job_id))
    if not found:
        return False
    path = max(found, key=os.path.getmtime)
    size = os.path.getsize(path)
    for window in (1 << 20, 1 << 24, 1 << 28):
        with open(path, "rb") as handle:
            handle.seek(max(size - window, 0))
            steps = STEP.findall(handle.read().decode("utf-8", "replace"))
        if steps:
            return int(steps[-1])
        if window >= size:
            break
    return None


def job(base, job_id, timeout, with_logs, logs_dir=""):
    if not job_id:
        return {"status": "NONE", "last_step": None, "start_time": 0}
    try:
        info = get(base + "/api/jobs/" + job_id, timeout)
    except HTTPError as exc:
        if exc.code != 404:
            raise
        return {"status": "NONE", "last_step": None, "start_time": 0}
    out = {"status": info["status"], "last_step": None, "start_time": int((info.get("start_time") or 0) / 1000)}
    step = tail_step(logs_dir, job_id) if logs_dir and info["status"] == "RUNNING" and not with_logs else False
    if step is not False:
        out["last_step"] = step
    elif info["status"] == "RUNNING" or with_logs:
        logs = get(base + "/api/jobs/" + job_id + "/logs", timeout * 2)["logs"]
        steps = STEP.findall(logs)
        out["last_step"] = int(steps[-1]) if steps else None
        if with_logs:
            out["logs"] = logs
    return out


def read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def keeper_view(keeper_dir, job_id, status):
    """(status, the keeper's record or None): a FAILED or unknown job is RESUMING while the keeper is on, alive and
    has neither resubmitted it, given up, nor seen it end."""
    config = read_json(os.path.join(keeper_dir, "keeper.json")) or {}
    path = os.path.join(keeper_dir, "keeper-status.json")
    record = read_json(path)
    if int(config.get("attempts", 0) or 0) <= 0 or not config.get("root"):
        return status, None
    if record is not None and record.get("root") != config.get("root"):
        record = None  # the keeper has not read this submission's keeper.json yet
    if job_id != (record.get("job_id") if record else config.get("root")):
        return status, None  # not the job the keeper keeps going
    if status not in ("FAILED", "NONE"):
        return status, record
    try:
        alive = time.time() - os.path.getmtime(path) < KEEPER_ALIVE_S
    except OSError:
        alive = False
    # a keeper that gave up, or saw the job end (a job Ray forgot since: its Ray restarted), resumes nothing
    if not alive or (record and record.get("state") in ("gave_up", "ended")):
        return status, record
    return "RESUMING", record


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "what": {"type": "str", "required": True, "choices": ["nodes", "job", "job_logs"]},
            "job_id": {"type": "str", "default": ""},
            "timeout": {"type": "int", "default": 30},
            "logs_dir": {"type": "str", "default": ""},
            "state_file": {"type": "str", "default": ""},
            "keeper_dir": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    base = p["url"].rstrip("/")
    try:
        if p["what"] == "nodes":
            result = nodes(base, p["timeout"])
        else:
            job_id = p["job_id"]
            if p["state_file"] and os.path.isfile(p["state_file"]):
                with open(p["state_file"]) as handle:
                    job_id = handle.read().strip() or job_id
            result = job(base, job_id, p["timeout"], with_logs=p["what"] == "job_logs", logs_dir=p["logs_dir"])
            result["job_id"] = job_id
            if p["keeper_dir"]:
                result["status"], result["keeper"] = keeper_view(p["keeper_dir"], job_id, result["status"])
    except (URLError, OSError, ValueError, KeyError) as exc:
        module.fail_json(msg="Ray's dashboard at {} did not answer as expected ({}): is Ray running on the head? "
                             "(`ray status` there)".format(base, exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
