"""strip-torch-pins.py SRC_DIR: remove vllm-ascend's torch / torch-npu requirement lines, print its build requires.

vllm-ascend at the pin asks for torch-npu==2.7.1.dev20250724 from a vendor index (requirements.txt and
pyproject.toml); installing it as is would replace the pinned torch_npu 2.7.1. The lines go, nothing else.
Python 3.10 has no tomllib: the build-system `requires` list is read with ast from the TOML array.
"""

import ast
import re
import sys
from pathlib import Path

TORCH_LINE = re.compile(r"""^\s*["']?torch([-_]npu)?\s*([<>=!~;\[]|["'],?\s*$|$)""", re.IGNORECASE)

src = Path(sys.argv[1])
removed = []
for name in ("requirements.txt", "pyproject.toml"):
    path = src / name
    if not path.exists():
        continue
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        if TORCH_LINE.match(line):
            removed.append(f"{name}: {line.strip()}")
        else:
            kept.append(line)
    path.write_text("".join(kept))
for line in removed:
    print(f"strip-torch-pins: removed {line}", file=sys.stderr)
if not removed:
    sys.exit("strip-torch-pins: no torch/torch-npu line found: vllm-ascend changed, check the pin")
match = re.search(r"^requires\s*=\s*(\[.*?\])", (src / "pyproject.toml").read_text(), re.MULTILINE | re.DOTALL)
if match:
    print("\n".join(ast.literal_eval(match.group(1))))
