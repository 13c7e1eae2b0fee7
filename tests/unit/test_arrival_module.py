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
    assert (out["current"], out["files"], out["plan_stale"], out["changed"]) == (0, 3, True, False)


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
