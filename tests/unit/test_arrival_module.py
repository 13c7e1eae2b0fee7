"""ansible/library/rollout8_arrival.py: `check` finds what a node lacks from a stat and the ledger, without reading;
`seal` hashes what arrived once, removes what differs, and writes the plan file last.

The module runs as Ansible runs it: a subprocess of this venv's python, given a file holding ANSIBLE_MODULE_ARGS,
printing its JSON result on stdout.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

MODULE = Path(__file__).resolve().parents[2] / "ansible" / "library" / "rollout8_arrival.py"
PLAN = '{"run": "demo", "copies": 2}\n'


def run(tmp_path: Path, **params) -> tuple[int, dict]:
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
    proc = subprocess.run([sys.executable, str(MODULE), str(args)], capture_output=True, text=True, timeout=60)
    return proc.returncode, json.loads(proc.stdout)


def node(tmp_path: Path) -> dict:
    """The node's paths and the controller's copies (arrival.json's shape): a dir copy of two files, a file copy."""
    root = tmp_path / "node"
    content = {f"{root}/model/weights.bin": os.urandom(4096), f"{root}/model/config.json": b'{"layers": 2}\n' * 100,
               f"{root}/spec.yaml": b"name: demo\n" * 200}

    def entry(path):
        return {"path": path, "size": len(content[path]), "sha256": hashlib.sha256(content[path]).hexdigest()}

    copies = [{"what": "model", "src": "/ctl/model", "dest": f"{root}/model", "kind": "dir",
               "files": [entry(f"{root}/model/weights.bin"), entry(f"{root}/model/config.json")]},
              {"what": "spec", "src": "/ctl/spec.yaml", "dest": f"{root}/spec.yaml", "kind": "file",
               "files": [entry(f"{root}/spec.yaml")]}]
    return {"root": root, "content": content, "copies": copies, "ledger": str(root / ".rollout8-ledger.json"),
            "plan": str(root / "plan.json"), "plan_b64": base64.b64encode(PLAN.encode()).decode()}


def arrive(n: dict) -> None:
    """What the transfer does: every file lands with the controller's bytes."""
    for path, data in n["content"].items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)


def call(tmp_path, n, mode, *, plan=True, copies=None):
    extra = {"plan": n["plan"], "plan_b64": n["plan_b64"]} if plan else {}
    return run(tmp_path, ledger=n["ledger"], copies=copies or n["copies"], mode=mode, **extra)


def test_check_on_an_empty_node_sends_every_copy(tmp_path):
    n = node(tmp_path)
    rc, out = call(tmp_path, n, "check")
    assert rc == 0, out
    assert out["stale"] == list(n["content"])
    assert out["send"] == n["copies"]
    # changed: it made the destination directories of what it sends (see the next test)
    assert (out["current"], out["files"], out["plan_stale"], out["changed"]) == (0, 3, True, True)


def test_seal_records_the_ledger_and_writes_the_plan_then_check_finds_nothing_to_send(tmp_path):
    n = node(tmp_path)
    arrive(n)
    rc, out = call(tmp_path, n, "seal")
    assert rc == 0, out
    assert out["changed"] is True and out["plan_written"] is True and out["sealed"] == 3
    ledger = json.loads(Path(n["ledger"]).read_text())
    for path, data in n["content"].items():
        stat = os.stat(path)
        assert ledger[path] == {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                                "sha256": hashlib.sha256(data).hexdigest()}
    assert Path(n["plan"]).read_text() == PLAN

    rc, out = call(tmp_path, n, "check")
    assert rc == 0, out
    assert (out["stale"], out["send"], out["current"], out["plan_stale"], out["changed"]) == ([], [], 3, False, False)


def test_check_does_not_read_content_but_a_changed_mtime_or_size_is_stale(tmp_path):
    n = node(tmp_path)
    arrive(n)
    assert call(tmp_path, n, "seal")[0] == 0
    weights, spec = f"{n['root']}/model/weights.bin", f"{n['root']}/spec.yaml"

    # Same size, same mtime, other bytes: not detected (the documented price of not re-reading).
    stat = os.stat(weights)
    Path(weights).write_bytes(b"\0" * stat.st_size)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    rc, out = call(tmp_path, n, "check")
    assert rc == 0 and out["stale"] == [] and out["send"] == [], out

    # Only the mtime moved: that file is stale, and only its copy is sent.
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    rc, out = call(tmp_path, n, "check")
    assert rc == 0, out
    assert out["stale"] == [weights] and out["send"] == [n["copies"][0]] and out["current"] == 2

    # Only the size changed (mtime put back): stale too.
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    stat = os.stat(spec)
    with open(spec, "ab") as handle:
        handle.write(b"x")
    os.utime(spec, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    rc, out = call(tmp_path, n, "check")
    assert rc == 0, out
    assert out["stale"] == [spec] and out["send"] == [n["copies"][1]]


def test_seal_of_a_file_that_differs_removes_it_fails_naming_it_and_writes_no_plan(tmp_path):
    n = node(tmp_path)
    arrive(n)
    assert call(tmp_path, n, "seal", plan=False)[0] == 0  # in the ledger once, with the right bytes
    config = f"{n['root']}/model/config.json"
    Path(config).write_bytes(b"X" * len(n["content"][config]))  # same size, other bytes

    rc, out = call(tmp_path, n, "seal")
    assert rc == 1 and out["failed"] is True
    assert config in out["msg"] and "arrived different" in out["msg"]
    assert not os.path.exists(config)
    ledger = json.loads(Path(n["ledger"]).read_text())
    assert config not in ledger and set(ledger) == set(n["content"]) - {config}
    assert not os.path.exists(n["plan"])


def test_seal_with_a_missing_file_fails_naming_it(tmp_path):
    n = node(tmp_path)
    arrive(n)
    spec = f"{n['root']}/spec.yaml"
    os.unlink(spec)
    rc, out = call(tmp_path, n, "seal")
    assert rc == 1 and out["failed"] is True
    assert f"did not arrive: {spec}" in out["msg"]
    assert not os.path.exists(n["plan"])


def test_check_reports_stale_when_the_controller_digest_changed_but_the_node_file_did_not(tmp_path):
    n = node(tmp_path)
    arrive(n)
    assert call(tmp_path, n, "seal")[0] == 0
    copies = json.loads(json.dumps(n["copies"]))
    changed = copies[1]["files"][0]
    changed["sha256"] = hashlib.sha256(b"the controller's new spec").hexdigest()
    rc, out = call(tmp_path, n, "check", copies=copies)
    assert rc == 0, out
    assert out["stale"] == [changed["path"]] and out["send"] == [copies[1]]


def test_seal_leaves_no_temporary_files(tmp_path):
    n = node(tmp_path)
    arrive(n)
    assert call(tmp_path, n, "seal")[0] == 0
    leftovers = [p.name for p in n["root"].rglob(".arrival-*")]
    assert leftovers == []
    assert json.loads(Path(n["ledger"]).read_text())  # the ledger is whole JSON


def test_check_makes_the_destination_directories_of_what_it_sends(tmp_path):
    """rsync makes only a destination's last directory: check makes the rest, for the copies it sends."""
    n = node(tmp_path)
    rc, out = call(tmp_path, n, "check")
    assert rc == 0 and out["changed"] is True
    assert (n["root"] / "model").is_dir() and sorted(out["made"]) == [str(n["root"]), str(n["root"] / "model")]
    rc, again = call(tmp_path, n, "check")
    assert rc == 0 and again["changed"] is False and again["made"] == []


def _sent(n: dict, mtime_ns: int) -> dict:
    """The files land with the controller's mtime (rsync -t); rsync's itemized output names them (`<f` lines,
    relative to the deploy root it was sent to)."""
    for path in n["content"]:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    for copy in n["copies"]:
        for entry in copy["files"]:
            entry["mtime_ns"] = mtime_ns
    return {"rsync_root": str(n["root"]), "rsync_output": "<f+++++++++ model/weights.bin\n<f+++++++++ model/config.json"
            "\n<f+++++++++ spec.yaml\n\nLiteral data: 4,096 bytes\n"}


def test_seal_takes_rsyncs_verification_of_what_it_sent_and_reads_the_rest(tmp_path):
    """A file rsync wrote (its whole-file checksum verified it) with the controller's size and mtime is recorded
    with the controller's sha256 unread: a wrong byte planted after rsync is not seen in it, which proves it was
    not read. A file rsync did not write (already there) is read: the same planted byte fails it."""
    n = node(tmp_path)
    arrive(n)
    results = _sent(n, 1_700_000_000_123_456_789)
    weights = f"{n['root']}/model/weights.bin"
    data = bytearray(n["content"][weights])
    data[7] ^= 1
    Path(weights).write_bytes(bytes(data))
    os.utime(weights, ns=(1_700_000_000_123_456_789,) * 2)
    rc, out = run(tmp_path, ledger=n["ledger"], copies=n["copies"], mode="seal", **results)
    assert rc == 0 and out["verified_by_rsync"] == 3 and out["read"] == 0, out
    # the same file, not among what rsync wrote: read, differs, removed, the run fails naming it
    others = dict(results, rsync_output=results["rsync_output"].replace("<f+++++++++ model/weights.bin\n", ""))
    rc, out = run(tmp_path, ledger=n["ledger"], copies=n["copies"], mode="seal", **others)
    assert rc == 1 and weights in out["msg"] and not Path(weights).exists(), out


def test_seal_reads_a_sent_file_whose_mtime_is_not_the_controllers(tmp_path):
    """The controller's file changed between the plan's sha256 and the send (another mtime): read, not trusted."""
    n = node(tmp_path)
    arrive(n)
    results = _sent(n, 1_700_000_000_000_000_000)
    spec = f"{n['root']}/spec.yaml"
    os.utime(spec, ns=(1_700_000_999_000_000_000,) * 2)
    rc, out = run(tmp_path, ledger=n["ledger"], copies=n["copies"], mode="seal", **results)
    assert rc == 0 and out["verified_by_rsync"] == 2 and out["read"] == 1, out


def test_seal_records_what_rsync_wrote_besides_the_stale_files(tmp_path):
    """One rsync sends the whole tree: a file of a copy check found current, written again because the
    controller's mtime moved (same bytes), must be recorded too, or the next check finds it stale."""
    n = node(tmp_path)
    arrive(n)
    rc, _ = call(tmp_path, n, "seal")
    assert rc == 0
    results = _sent(n, 1_700_000_000_000_000_000)  # every file lands again, with the controller's new mtime
    spec = f"{n['root']}/spec.yaml"
    weights = f"{n['root']}/model/weights.bin"
    rc, out = run(tmp_path, ledger=n["ledger"], copies=n["copies"], mode="seal", stale=[spec], **results)
    assert rc == 0 and out["sealed"] == 3, out
    rc, out = call(tmp_path, n, "check")
    assert rc == 0 and out["stale"] == [], out
    # without the rsync output, only the stale file is recorded: the others stay stale
    results = _sent(n, 1_700_000_001_000_000_000)
    rc, out = run(tmp_path, ledger=n["ledger"], copies=n["copies"], mode="seal", stale=[spec])
    assert rc == 0 and out["sealed"] == 1, out
    rc, out = call(tmp_path, n, "check")
    assert rc == 0 and weights in out["stale"] and spec not in out["stale"], out
