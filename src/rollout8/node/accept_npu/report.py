"""The suite's result lines: one PASS/FAIL/SKIP line per step, in STEPS order, and the one verdict under them.

tests/npu/conftest.py prints them at the end of `make accept-npu` (and writes WORK/acceptance.txt); the
accept_npu Ansible role picks them out of that output by their first word: their text is an interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
STEPS = ("environment", "cann-pairing", "ray-npu", "loading", "reload", "logs", "speed", "weight-sync", "hccl")


@dataclass
class StepResult:
    step: str
    status: str  # PASS | FAIL | SKIP
    summary: str
    details: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == PASS

    def line(self) -> str:
        return f"{self.status} {self.step}: {self.summary}"


def result(step: str, checks: list[tuple[bool, str]]) -> StepResult:
    """One step from (ok, message) checks: PASS if all pass; the summary names the failures, else all checks."""
    failed = [msg for ok, msg in checks if not ok]
    if not checks:
        return StepResult(step, FAIL, "nothing was checked")
    if failed:
        return StepResult(step, FAIL, "; ".join(failed), [m for _, m in checks])
    return StepResult(step, PASS, "; ".join(m for _, m in checks), [m for _, m in checks])


def format_report(results: list[StepResult]) -> str:
    """The step lines and one verdict. A skipped step (e.g. hccl with one node) is named, not counted: the
    verdict is PASS when every step that ran passed."""
    lines = [r.line() for r in results]
    passed = sum(r.ok for r in results)
    failed = [r.step for r in results if r.status == FAIL]
    skipped = [r.step for r in results if r.status == SKIP]
    ran = len(results) - len(skipped)
    verdict = PASS if ran and not failed and passed == ran else FAIL
    tail = f" (failed: {', '.join(failed)})" if failed else ""
    skip = f"; skipped: {', '.join(skipped)}" if skipped else ""
    lines.append(f"acceptance: {verdict} ({passed}/{ran} steps passed{skip}){tail}")
    return "\n".join(lines)
