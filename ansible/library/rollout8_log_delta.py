#!/usr/bin/python
"""What a node's Ray logs gained since the controller's last collection, packed for the verify play (issue 28,
part 4: a multi-day run's gigabytes of logs are sent once, each verify sends what was written since). Python 3.7
compatible: it runs on the node's own Python.

Under `root` (a Ray session directory), the files below `subdir` (logs) modified since `since` (seconds since the
epoch: the job's start, so an earlier job's logs are not judged with this one's) are compared with `have`, the
controller's copies (path relative to `root` -> size). A file the controller has whole is left out; one it has a
prefix of is packed from that size on; one it lacks, or has more of than there is (a file that was truncated or
replaced), is packed whole. `dest` is a gzip'd tar of those parts, named by their relative paths, and the member
`.rollout8-delta.json` says where each part starts ({path: offset}); `rollout8 collect-merge` appends them on the
controller. A file that grows while it is packed is packed up to the size it had when listed (the rest comes next
time); one that shrinks meanwhile (truncated or rotated under the collection) is packed up to what could be read, so
the archive stays whole, and one that became shorter than the controller's copy is left for the next collection,
which then sends it whole. Returns `files` (parts packed), `bytes` (their size, what is sent before compression)
and `total` (the size of every file considered). `changed` is always false: the node's logs are only read.
"""


import io
import json
import os
import tarfile
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

MANIFEST = ".rollout8-delta.json"
SPOOL_IN_MEMORY = 8 << 20  # a part larger than this is staged in a file beside dest


def candidates(root, subdir, since):
    """(relative path, size) of every regular file below root/subdir modified at or after `since`."""
    out = []
    for top, dirs, files in os.walk(os.path.join(root, subdir)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue  # gone since it was listed
            if not os.path.isfile(path) or os.path.islink(path) or st.st_mtime < since:
                continue
            out.append((os.path.relpath(path, root), st.st_size))
    return out


def add_part(tar, path, rel, start, wanted, spool_dir):
    """Add at most `wanted` bytes of `path` from `start` as member `rel`; return how many were added. The bytes are
    staged first: tarfile writes a member's size before its data, and a file truncated between listing and reading
    would otherwise end the member early and break the archive ("unexpected end of data")."""
    try:
        handle = open(path, "rb")
    except OSError:
        return 0
    with handle, tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY, dir=spool_dir) as part:
        handle.seek(start)
        left = wanted
        while left > 0:
            chunk = handle.read(min(left, 1 << 20))
            if not chunk:
                break
            part.write(chunk)
            left -= len(chunk)
        length = wanted - left
        if not length:
            return 0
        part.seek(0)
        info = tarfile.TarInfo(rel)
        info.size = length
        info.mtime = int(time.time())
        info.mode = 0o644
        tar.addfile(info, part)
    return length


def pack(root, subdir, since, have, dest):
    offsets, sent, total = {}, 0, 0
    tmp = dest + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for rel, size in candidates(root, subdir, since):
            total += size
            start = int(have.get(rel, 0))
            if start > size:
                start = 0
            if start == size:
                continue
            length = add_part(tar, os.path.join(root, rel), rel, start, size - start, os.path.dirname(dest))
            if not length:
                continue  # gone, or now shorter than the controller's copy: sent whole next time
            offsets[rel] = start
            sent += length
        manifest = json.dumps(offsets, sort_keys=True).encode("utf-8")
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(manifest)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(manifest))
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
    return {"files": len(offsets), "bytes": sent, "total": total}


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "subdir": {"type": "str", "default": "logs"},
            "since": {"type": "float", "default": 0},
            "have": {"type": "dict", "default": {}},
            "dest": {"type": "path", "required": True},
        },
        supports_check_mode=False,
    )
    p = module.params
    if not os.path.isdir(os.path.join(p["root"], p["subdir"])):
        module.fail_json(msg="%s: no Ray logs here (is Ray's temp directory rollout8_ray_temp_dir?)"
                         % os.path.join(p["root"], p["subdir"]))
    try:
        result = pack(p["root"], p["subdir"], p["since"], p["have"] or {}, p["dest"])
    except (OSError, tarfile.TarError) as exc:
        module.fail_json(msg="packing the Ray logs of %s into %s failed: %s" % (p["root"], p["dest"], exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
