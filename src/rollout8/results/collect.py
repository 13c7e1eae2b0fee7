"""The controller's side of verify's incremental log collection (issue 28, part 4): a node's delta archive
(ansible/library/rollout8_log_delta.py: the parts of its Ray logs written since the last collection, and
`.rollout8-delta.json`, where each part starts) appended to the controller's copies.

A part that starts at 0 replaces the copy; one that starts at N is appended to a copy of exactly N bytes (what the
controller said it had). A copy of another size means the two sides disagree (a copy edited or removed since):
refused naming the file, as is a member that would land outside the directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from ..errors import Rollout8Error

MANIFEST = ".rollout8-delta.json"


def merge(archive: Path, directory: Path) -> tuple[int, int]:
    """Append the archive's parts to the copies under `directory`; returns (files, bytes) merged."""
    files = written = 0
    try:
        with tarfile.open(archive, "r:gz") as tar:
            member = tar.getmember(MANIFEST)
            offsets = json.loads(tar.extractfile(member).read())
            for member in tar:
                if member.name == MANIFEST:
                    continue
                rel = PurePosixPath(member.name)
                if not member.isfile() or rel.is_absolute() or ".." in rel.parts or member.name not in offsets:
                    raise Rollout8Error(f"{archive}: {member.name!r} is not a log part of this collection")
                target = directory / rel
                start = int(offsets[member.name])
                target.parent.mkdir(parents=True, exist_ok=True)
                have = target.stat().st_size if target.exists() else 0
                if start and have != start:
                    raise Rollout8Error(f"{target}: the controller's copy has {have} bytes, the node sent the part "
                                        f"from byte {start}: remove {directory} and verify again")
                source = tar.extractfile(member)
                with open(target, "ab" if start else "wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
                os.chmod(target, 0o644)
                files += 1
                written += member.size
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise Rollout8Error(f"{archive}: not a log delta archive ({exc})") from exc
    return files, written
