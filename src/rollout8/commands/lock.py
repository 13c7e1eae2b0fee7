"""`rollout8 lock`: arguments, output and exit code; the work is rollout8.lock."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import LockError
from ..lock import (
    README_BEGIN,
    README_END,
    cann_report,
    format_build_args,
    format_env,
    format_markdown,
    format_table,
    get_value,
    load_lock,
    set_base_digest,
    update_readme,
)
from ..paths import lock_path
from ..pylock import unpinned_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lock", type=Path, default=None, help="lock file (default: the bundle's versions.lock.yaml)")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--build-args", action="store_true", help="print the --build-arg list for docker build")
    fmt.add_argument("--env", action="store_true", help="print KEY=VALUE lines (same keys as the build args)")
    fmt.add_argument("--markdown", action="store_true", help="print the README version table")
    fmt.add_argument("--constraints", action="store_true", help="print the pip constraints file of the PyPI pins")
    fmt.add_argument("--node-python", action="store_true",
                     help="print the requirement lines of the nodes' Python libraries (make node-wheels)")
    fmt.add_argument("--json", action="store_true", help="print the lock and its derived values as JSON")
    fmt.add_argument("--get", metavar="KEY", help="print one value: version, image, digest, or a build-arg key")
    fmt.add_argument("--check", action="store_true",
                     help="validate, check the hashed Python lock (docker/requirements/) is current and hashed, and "
                          "report what is still unpinned (exit 1 on a problem, not on what is reported)")
    fmt.add_argument("--check-wheels", action="store_true",
                     help="prove every line of docker/requirements/*-<arch>.txt and every PyPI pin has a file on the "
                          "index that pip installs on the lock's CPython, manylinux, for aarch64 and x86_64 (PyPI JSON "
                          "API, or ROLLOUT8_INDEX_URL / PIP_INDEX_URL=<base>/simple; CA bundle from SSL_CERT_FILE; "
                          "answers cached in .cache/index-json); exit 1 naming each line that has none")
    fmt.add_argument("--set-base-digest", metavar="DIGEST",
                     help="write base_image.digest (sha256:...) into the lock file (make base-digest)")
    fmt.add_argument("--cann-files", metavar="DIR", type=Path, nargs="?", const=Path("docker/cann"),
                     help="list the CANN installers the lock expects and check those in DIR (default docker/cann)")
    fmt.add_argument("--update-readme", metavar="FILE", type=Path,
                     help=f"rewrite the version table between {README_BEGIN} and {README_END} in FILE")


def run(args: argparse.Namespace) -> int:
    lock = load_lock(args.lock)
    if args.build_args:
        print(format_build_args(lock))
    elif args.env:
        print(format_env(lock))
    elif args.markdown:
        print(format_markdown(lock))
    elif args.constraints:
        print(lock.constraints(), end="")
    elif args.node_python:
        print(lock.node_python_requirements(), end="")
    elif args.json:
        out = {"lock": lock.model_dump(mode="json", by_alias=True), "digest": lock.digest(),
               "image": lock.image_ref(), "build_args": lock.build_args()}
        print(json.dumps(out, indent=2))
    elif args.get:
        print(get_value(lock, args.get))
    elif args.cann_files:
        text, ok = cann_report(lock, args.cann_files)
        print(text)
        if not ok:
            raise LockError(f"{args.cann_files}: an installer there does not match the lock (see above)")
    elif args.update_readme:
        changed = update_readme(lock, args.update_readme)
        print(f"{args.update_readme}: version table {'updated' if changed else 'already up to date'}")
    elif args.set_base_digest:
        path = args.lock or lock_path()
        set_base_digest(path, args.set_base_digest)
        print(f"{path}: base_image.digest = {args.set_base_digest}")
    elif args.check:
        path = args.lock or lock_path()
        problems, floating = unpinned_report(lock, path)
        for line in floating:
            print(f"still unpinned: {line}")
        for line in problems:
            print(f"PROBLEM: {line}")
        if problems:
            raise LockError(f"{path}: {len(problems)} problem(s) with the hashed Python lock (see above)")
        print(f"{path}: valid (digest {lock.digest()[:12]})")
    elif args.check_wheels:
        from .. import wheelcheck  # urllib, ssl, threads: only for this check

        wheelcheck.check(lock, args.lock or lock_path())
    else:
        print(format_table(lock))
    return 0

