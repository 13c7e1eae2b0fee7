#!/usr/bin/env python3
"""Regenerate the `rollout8 import` corpus (tests/unit/fixtures/verl_scripts/) from a verl checkout.

    scripts/import-corpus.py VERL [--commit REV] [--out DIR]

VERL is a verl work tree, or a git directory (a bare mirror) with --commit. The corpus is every launch script for
NPU under examples/, recipe/ and tests/special_npu/ at the commit (a `.sh` whose name or text says npu or ascend as
a word, not `input`): GRPO/DAPO/PPO with vLLM rollouts are the corpus proper; SFT, sglang and Ray-helper scripts are
kept too, as the refusals they must be. Each fixture is the upstream text verbatim under a header naming its path,
the commit and verl's Apache-2.0 notice (copied from verl's own files); corpus.json lists what was kept and why, and
what was left out. Test data only: the product never reads these files.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOTS = ("examples/", "recipe/", "tests/special_npu/")
NPU = re.compile(r"(?<![a-z])npu(?![a-z])|ascend", re.IGNORECASE)
HEADER_LINES = 17  # the header's length: upstream line N is line N + HEADER_LINES of a fixture
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "unit" / "fixtures" / "verl_scripts"


class Verl:
    def __init__(self, root: Path, commit: str | None) -> None:
        self.root, self.commit = root, commit

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.root), *args], check=True, capture_output=True,
                              text=True).stdout

    def paths(self) -> list[str]:
        rev = self.commit or "HEAD"
        return sorted(p for p in self.git("ls-tree", "-r", "--name-only", rev, "--", *ROOTS).splitlines()
                      if p.endswith(".sh"))

    def read(self, path: str) -> str:
        if self.commit:
            return self.git("show", f"{self.commit}:{path}")
        return (self.root / path).read_text()

    def full_commit(self) -> str:
        return self.git("rev-parse", self.commit or "HEAD").strip()


def notice(verl: Verl) -> list[str]:
    """The Apache-2.0 notice verl's own files carry (verl/__init__.py), verbatim."""
    lines = verl.read("verl/__init__.py").splitlines()
    end = next(n for n, line in enumerate(lines) if "limitations under the License." in line)
    return lines[:end + 1]


def classify(text: str) -> tuple[str, str]:
    """(kind, why): kind is "corpus" (GRPO/DAPO/PPO with vLLM), "sft", "sglang" or "ray-helper"."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    module = re.search(r"-m\s+([\w.]+)", code)
    if module is None or "torchrun" in code and "sft" in module.group(1):
        if module is not None:
            return "sft", f"an SFT launch (torchrun -m {module.group(1)}), not RL"
        return "ray-helper", "starts Ray and submits nothing itself (a Ray helper)"
    if "sft" in module.group(1):
        return "sft", f"an SFT launch (-m {module.group(1)}), not RL"
    if re.search(r"rollout\.name=sglang", code):
        return "sglang", "rollouts by sglang, not vLLM"
    return "corpus", f"RL launch (-m {module.group(1)}) with vLLM rollouts"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("verl", type=Path, help="a verl work tree, or its git directory with --commit")
    parser.add_argument("--commit", help="read the files at this commit (git show), not the work tree")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    verl = Verl(args.verl, args.commit)
    commit = verl.full_commit()
    header_notice = notice(verl)
    kept = []
    for path in verl.paths():
        text = verl.read(path)
        if not NPU.search(path) and not NPU.search(text):
            continue  # not an NPU script (`input_tokenizer` is not npu)
        kind, why = classify(text)
        name = path.replace("/", "__")
        header = [f"# rollout8 import corpus: verl {path} at commit {commit},",
                  f"# verbatim below this header of {HEADER_LINES} lines (upstream line N is line N+{HEADER_LINES} "
                  "here).",
                  "# Test data for tests/unit/test_import_corpus.py; regenerate: scripts/import-corpus.py VERL.",
                  "# From verl (https://github.com/volcengine/verl), which carries this notice:", *header_notice]
        header += ["#" + "-" * 100] * (HEADER_LINES - len(header))
        if len(header) != HEADER_LINES:
            raise SystemExit(f"the header is {len(header)} lines, not {HEADER_LINES}")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / name).write_text("\n".join(header) + "\n" + text)
        kept.append({"fixture": name, "source": path, "kind": kind, "why": why})
    left_out = [{"source": path, "why": "for GPUs: neither its name nor its text says npu or ascend"}
                for path in verl.paths() if path.startswith("tests/special_npu/")
                and path not in {k["source"] for k in kept}]
    manifest = {"verl_commit": commit, "header_lines": HEADER_LINES, "roots": list(ROOTS),
                "selection": "every .sh under the roots whose path or text says npu or ascend as a word",
                "scripts": kept, "left_out": left_out,
                "left_out_count": len(verl.paths()) - len(kept)}
    (args.out / "corpus.json").write_text(json.dumps(manifest, indent=1) + "\n")
    counts = {kind: sum(k["kind"] == kind for k in kept) for kind in ("corpus", "sft", "sglang", "ray-helper")}
    print(f"{len(kept)} NPU scripts of {len(verl.paths())} at {commit[:7]} in {args.out}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
