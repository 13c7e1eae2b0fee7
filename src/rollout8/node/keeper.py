"""The training container's first process: keeps this node's Ray up and, on the head, the run's job going.

A node (or its training container) that restarts comes back without Ray, and a job that failed because a node or
rank died stays failed until someone runs train.yml again, at night too. The keeper closes both, on the cluster
(not in the controller's shell), from files in the node's run directory (rollout8_home/run, mounted into the
training container at the same path):

- ray-state.json: how the ray role last started Ray here (its argv among the rest). When no raylet runs in the
  container and the play does not hold Ray (keeper.pause, written by the ray role while it stops and starts Ray,
  younger than PAUSE_MAX_S), the keeper starts Ray with that argv (a worker rejoins the head at the same address;
  the head starts a new GCS, and the workers' raylets, which exit once the old one is gone, rejoin it). Without
  ray-state.json (a node never converged, or reset) it does nothing.
- keeper.json (the head only): the run's job to watch, written by the launch role when it submits a verl job:
  the job state file (the current submission id; the keeper rewrites it when it resubmits), the entrypoint, the
  nodes and NPUs the job needs, the attempt limit, the bounded wait and the hook. `attempts: 0` disables it.
- keeper-status.json (written here): what the keeper decided about the current job: watching, waiting (for the
  cluster to be whole again after a failure), resubmitted (an attempt), gave_up (and why), or ended. The verify
  role and `rollout8 progress` show its attempts; the verify role treats a failed job the keeper has not judged
  yet, or is resuming, as not ended.

Automatic resume: a job that FAILED, or that Ray no longer knows (the head's Ray restarted with its container), is
resubmitted under a new submission id with the same entrypoint (the rendered spec resumes from the run's latest
checkpoint: trainer.resume_mode auto), once every node the job needs is registered with its NPUs and has been for
SETTLE_S (a dead node stays listed alive for a few seconds), waiting at most `wait_s`. It gives up after `attempts`
resubmissions, when the same step fails twice, or when the cluster is not whole in time, naming what is missing.
A job that was STOPPED (by a person, or by `-e rollout8_replace=true`) is not resumed. Each decision is printed (the
container's log) and recorded, and the optional hook is told on each resume and on every end.

The decisions are pure functions of the recorded status and what Ray says (`judge`, `whole`), tested without a
cluster; the loop around them only reads files, asks Ray's dashboard (urllib, no Ray client) and writes.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..fileutil import atomic_write
from ..results.progress import is_error_line

TICK_S = 5.0
PAUSE_MAX_S = 900  # a keeper.pause older than this was left by a play that died: the keeper goes on
SETTLE_S = 30.0
STATUS = "keeper-status.json"
CONFIG = "keeper.json"
RAY_STATE = "ray-state.json"
PAUSE = "keeper.pause"
LOCK = "keeper.lock"
# verl's console logger: `step:12 - ... - timing_s/step:3.4 ...` (rollout8_ray_api's pattern)
STEP = re.compile(r"(?<![\w/])step:(\d+) - .*timing_s/step:")
ENDED = ("SUCCEEDED", "STOPPED")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its worker prefixes


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} rollout8 keeper: {message}", flush=True)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# --- Ray on this node ------------------------------------------------------------------------------------------

def raylet_running(proc: Path = Path("/proc")) -> bool:
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "raylet":
                    return True
            except OSError:
                continue
    return False


def paused(run: Path, now: float) -> bool:
    try:
        return now - (run / PAUSE).stat().st_mtime < PAUSE_MAX_S
    except OSError:
        return False


def ray_argv(state: dict) -> list[str]:
    """The command the ray role started Ray with, without the `docker exec` around it (this process runs in the
    container, under the image's entrypoint already)."""
    argv = state.get("argv")
    return [str(a) for a in argv] if isinstance(argv, list) and argv else []


def keep_ray(run: Path, now: float, proc: Path = Path("/proc")) -> bool:
    """Start Ray when none runs here, the play recorded how, and the play does not hold it. True if started."""
    state = read_json(run / RAY_STATE)
    argv = ray_argv(state or {})
    if not argv or paused(run, now) or raylet_running(proc):
        return False
    lock = os.open(run / LOCK, os.O_RDONLY | os.O_CREAT, 0o644)  # (root's, when the ray role made it: read-only)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the ray role takes it before it decides: never both at once
        if paused(run, time.time()) or raylet_running(proc):
            return False
        log(f"no raylet here: starting Ray as the ray role last did: {shlex.join(argv)}")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    finally:
        os.close(lock)
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    log(f"ray start exited {done.returncode}: {' | '.join(tail)}")
    return done.returncode == 0


# --- the run's job (head) --------------------------------------------------------------------------------------

def get(url: str, timeout: float = 10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read().decode("utf-8", "replace"))


def job_status(api: str, job_id: str) -> dict | None:
    """Ray's record of a job ({status, message}); LOST when Ray does not know it (its GCS restarted); None when the
    dashboard does not answer (Ray starting, or down: nothing to judge yet)."""
    try:
        info = get(f"{api}/api/jobs/{job_id}")
    except urllib.error.HTTPError as exc:
        return {"status": "LOST", "message": "Ray no longer knows the job (its head restarted)"} \
            if exc.code == 404 else None
    except (OSError, ValueError):
        return None
    return {"status": info.get("status", ""), "message": info.get("message") or ""}


def alive_nodes(api: str) -> dict[str, float] | None:
    """node ip -> its NPU count, for every alive node; None when the dashboard does not answer."""
    try:
        data = get(f"{api}/api/v0/nodes?limit=10000")
    except (OSError, ValueError):
        return None
    return {n["node_ip"]: n.get("resources_total", {}).get("NPU", 0)
            for n in data["data"]["result"]["result"] if n.get("state") == "ALIVE"}


def whole(need: dict[str, str], npus: float, alive: dict[str, float]) -> list[str]:
    """The hosts (of need: host -> ip) not registered with their NPUs: empty when the cluster is whole."""
    return [host for host, ip in need.items() if alive.get(ip, -1) < npus]


def failed_at(logs_dir: str, job_id: str) -> tuple[int | None, str]:
    """The last training step and the last error line in the tail of the job's driver log (any Ray session: the
    head's Ray may have restarted since)."""
    found = sorted(Path(logs_dir).glob(f"session_*/logs/job-driver-{job_id}.log"), key=lambda p: p.stat().st_mtime)
    if not found:
        return None, ""
    with open(found[-1], "rb") as handle:
        handle.seek(max(found[-1].stat().st_size - (1 << 22), 0))
        text = handle.read().decode("utf-8", "replace")
    steps = STEP.findall(text)
    errors = [line.strip() for line in text.splitlines() if is_error_line(line)]
    return (int(steps[-1]) if steps else None), (errors[-1][:300] if errors else "")


def brief(text: str) -> str:
    """One short line of a cause: Ray's job message carries the driver's last 20,000 characters after its first
    clause ("Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars): ...")."""
    first = ANSI.sub("", text).split(", last available logs", 1)[0].strip().splitlines()
    return " ".join(first[0].split())[:200] if first else ""


def fresh(config: dict) -> dict:
    return {"root": config["root"], "job_id": config["root"], "state": "watching", "judged": "", "attempts": [],
            "reason": "", "since": 0.0, "whole_since": 0.0, "missing": []}


def judge(status: dict, config: dict, job: dict | None, now: float, step: int | None = None,
          cause: str = "") -> tuple[dict, str]:
    """The next status and the action: "" (nothing), "wait" (start waiting for the cluster), "end" (the job ended:
    tell the hook) or "give_up". `job` is Ray's record of status['job_id'] (None: Ray did not answer)."""
    status = dict(status)
    if job is None or status["state"] in ("gave_up", "ended", "waiting") or status["judged"] == status["job_id"]:
        return status, ""
    state = job["status"]
    if state in ("RUNNING", "PENDING", ""):
        status["state"] = "watching"
        return status, ""
    status["judged"] = status["job_id"]
    if state in ENDED:
        status["state"] = "ended"
        status["reason"] = f"job {status['job_id']} {state}"
        return status, "end"
    why = "; ".join(x for x in (brief(job.get("message", "")), brief(cause)) if x)
    tries = status["attempts"]
    at = "before any training step" if step is None else f"at step {step}"
    if len(tries) >= int(config.get("attempts", 0)):
        status.update(state="gave_up", reason=f"job {status['job_id']} {state} {at} ({why}); "
                      f"{len(tries)} of {config.get('attempts', 0)} automatic resumes used")
        return status, "give_up"
    if tries and tries[-1].get("step") == step:
        status.update(state="gave_up", reason=f"job {status['job_id']} {state} {at} again, as the attempt before "
                      f"it did ({why}): not resumed a third time")
        return status, "give_up"
    status.update(state="waiting", since=now, whole_since=0.0,
                  pending={"failed_job": status["job_id"], "state": state, "step": step, "cause": why})
    return status, "wait"


def wait_step(status: dict, config: dict, missing: list[str] | None, now: float) -> tuple[dict, str]:
    """While waiting: "resubmit" once every node has been back for SETTLE_S, "give_up" after wait_s."""
    status = dict(status)
    if missing is None or missing:
        status["whole_since"] = 0.0
        if missing:
            status["missing"] = missing
    elif not status["whole_since"]:
        status["whole_since"] = now
    settle = float(config.get("settle_s", SETTLE_S))
    if status["whole_since"] and now - status["whole_since"] >= settle:
        return status, "resubmit"
    wait_s = float(config.get("wait_s", 1800))  # (the launch role always writes rollout8_autoresume_wait_s)
    if now - status["since"] >= wait_s:
        gone = ", ".join(status.get("missing") or []) or "Ray's dashboard"
        pending = status.get("pending", {})
        status.update(state="gave_up", reason=f"job {pending.get('failed_job')} {pending.get('state')}; the cluster "
                      f"was not whole again within {int(wait_s)} s: {gone} not back")
        return status, "give_up"
    return status, ""


def submit(api: str, entrypoint: str, job_id: str) -> None:
    body = json.dumps({"entrypoint": entrypoint, "submission_id": job_id}).encode()
    request = urllib.request.Request(f"{api}/api/jobs/", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def notify(config: dict, event: str, line: str) -> None:
    """The inventory's hook, bounded: a command (run with ROLLOUT8_EVENT and ROLLOUT8_LINE set) or a URL (a JSON
    POST of event, line and run). Its failure is printed, never fatal."""
    payload = {"event": event, "line": line, "run": config.get("run", "")}
    try:
        if config.get("hook_url"):
            request = urllib.request.Request(config["hook_url"], data=json.dumps(payload).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
        if config.get("hook_command"):
            subprocess.run(["sh", "-c", config["hook_command"]], timeout=60, check=True,
                           env={**os.environ, "ROLLOUT8_EVENT": event, "ROLLOUT8_LINE": line})
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log(f"the hook failed ({event}): {exc}")


def watch(run: Path, now: float) -> None:
    config = read_json(run / CONFIG)
    if not config or int(config.get("attempts", 0)) <= 0 or not config.get("root"):
        return
    status = read_json(run / STATUS)
    if not status or status.get("root") != config["root"]:
        status = fresh(config)  # a new submission by the play: its own attempts
    state_file = Path(config["state_file"])
    current = state_file.read_text().strip() if state_file.is_file() else ""
    if current and current != status["job_id"] and status["state"] != "waiting":
        status.update(job_id=current, state="watching")
    api = config["api"]
    before = status["state"]
    if status["state"] == "waiting":
        alive = alive_nodes(api)
        missing = None if alive is None else whole(config["nodes"], float(config.get("npus", 0)), alive)
        status, action = wait_step(status, config, missing, now)
        if action == "resubmit":
            pending = status.pop("pending", {})
            number = len(status["attempts"]) + 1
            new_id = f"{config['root']}-r{number}"
            submit(api, config["entrypoint"], new_id)
            atomic_write(state_file, new_id + "\n")
            status["attempts"].append({**pending, "n": number, "job_id": new_id, "at": int(now),
                                       "waited_s": int(now - status["since"])})
            status.update(job_id=new_id, state="watching", judged="", missing=[])
            line = (f"run {config.get('run')}: job {pending.get('failed_job')} {pending.get('state')} at step "
                    f"{pending.get('step')} ({pending.get('cause')}); automatic resume {number} of "
                    f"{config.get('attempts')}: submitted {new_id}")
            log(line)
            notify(config, "resumed", line)
    else:
        job = job_status(api, status["job_id"])
        step, cause = (None, "")
        if job and job["status"] in ("FAILED", "LOST"):
            step, cause = failed_at(config.get("logs_dir", ""), status["job_id"])
        status, action = judge(status, config, job, now, step, cause)
        if action == "wait":
            log(f"job {status['job_id']} {job['status']} at step {step} ({cause or job.get('message')}): waiting "
                f"up to {config.get('wait_s')} s for every node to be back, then resuming it")
        elif action == "end":
            notify(config, "ended", f"run {config.get('run')}: {status['reason']}")
    if status["state"] == "gave_up" and before != "gave_up":
        line = f"run {config.get('run')}: automatic resume gave up: {status['reason']}"
        log(line)
        notify(config, "gave_up", line)
    atomic_write(run / STATUS, json.dumps(status, indent=1))


def summary(status: dict | None, limit: int | str = "?") -> str:
    """One line for verify and `rollout8 progress`: the automatic resumes so far and, when it gave up, why."""
    if not status:
        return ""
    tries = status.get("attempts") or []
    parts = [f"automatic resume {t['n']} of {limit}: job {t.get('failed_job')} {t.get('state')} at step "
             f"{t.get('step')} ({t.get('cause') or 'no cause logged'}), resumed as {t.get('job_id')} after "
             f"{t.get('waited_s')} s" for t in tries]
    if status.get("state") == "waiting":
        pending = status.get("pending") or {}
        parts.append(f"job {pending.get('failed_job')} {pending.get('state')} at step {pending.get('step')}: "
                     f"waiting for every node to be back ({', '.join(status.get('missing') or []) or 'settling'})")
    if status.get("state") == "gave_up":
        parts.append(f"automatic resume gave up: {status.get('reason')}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout8.node.keeper", description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="the node's run directory (rollout8_home/run)")
    parser.add_argument("--once", action="store_true", help="one round, then exit (tests)")
    args = parser.parse_args(argv)
    run = Path(args.run)
    log(f"watching {run} (Ray here; the run's job where {CONFIG} names one)")
    while True:
        for step in (keep_ray, watch):
            try:
                step(run, time.time())
            except Exception as exc:  # noqa: BLE001 - the keeper outlives any one round's failure, and says it
                log(f"{step.__name__}: {type(exc).__name__}: {exc}")
        if args.once:
            return 0
        time.sleep(TICK_S)


if __name__ == "__main__":
    sys.exit(main())
