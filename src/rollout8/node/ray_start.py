"""`ray start` with a bounded retry of the one failure a busy head gives it for no fault of its own.

Ray's head waits a fixed 20 s for its dashboard to register (200 polls of 0.1 s in
ray._private.services.start_api_server at the pinned Ray 2.46, no setting moves it). On a head busy with something
else (the stopped job's workers still exiting, an image loading beside it, 2 cores shared by three simulated nodes)
the dashboard can take longer: `ray start --head` then exits 1 ("Failed to start the dashboard", the last lines of
dashboard.log, which show it still loading its modules) and leaves the GCS it started running. The job API lives
in that dashboard, so the run cannot be submitted. CI met it once (stop 54: the lifecycle test's replace step).

This runs the ray role's `ray start` argv (the ray role and the keeper both start Ray through it): on that failure
it stops what the start left (`ray stop --force`, the same Ray executable), says so in one line and starts again,
at most ATTEMPTS times. Any other failure (a port taken, a bad argument, a head that is not there) would fail the
same way again: its exit code is returned at once, with its output.

    python -m rollout8.node.ray_start /opt/rollout8/venv/bin/ray start --head ...
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

ATTEMPTS = 3
PAUSE_S = 5.0
# what Ray prints when its dashboard did not register in time (services.start_api_server)
TRANSIENT = ("Failed to start the dashboard", "it contains the error message from the dashboard")


def ray_executable(argv: Sequence[str]) -> int:
    """The index of the Ray executable in argv (an `env --unset=...` may come before it)."""
    for i, arg in enumerate(argv):
        if os.path.basename(arg) == "ray":
            return i
    raise ValueError(f"no ray executable in {list(argv)}")


def stop_argv(argv: Sequence[str]) -> list[str]:
    """`ray stop --force` with the same Ray (and whatever precedes it) as the start."""
    return [*argv[:ray_executable(argv) + 1], "stop", "--force"]


def transient(output: str) -> bool:
    return any(mark in output for mark in TRANSIENT)


def start(argv: Sequence[str], attempts: int = ATTEMPTS, pause_s: float = PAUSE_S,
          say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> int:
    """Run argv; on the dashboard's timeout, stop what it left and run it again (at most `attempts` runs in all).
    Its output is passed through; the exit code is the last run's."""
    ray_executable(argv)  # refuse an argv without Ray before running anything
    rc = 1
    for attempt in range(1, attempts + 1):
        done = subprocess.run(list(argv), capture_output=True, text=True)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        rc = done.returncode
        if rc == 0 or not transient(done.stdout + done.stderr):
            return rc
        if attempt == attempts:
            say(f"rollout8 ray_start: Ray's dashboard did not register within Ray's fixed 20 s on {attempts} "
                "attempts: this head is too busy to start Ray; see dashboard.log in Ray's session directory")
            return rc
        subprocess.run(stop_argv(argv), capture_output=True, text=True)
        say(f"rollout8 ray_start: attempt {attempt} of {attempts}: Ray's dashboard did not register within Ray's "
            f"fixed 20 s (a busy head); stopped what the start left, starting again in {pause_s:g} s")
        time.sleep(pause_s)
    return rc


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    return start(args)


if __name__ == "__main__":
    sys.exit(main())
