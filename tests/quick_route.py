"""config/quick-loopback.sh run where it touches nothing of this machine: a command line that
makes a fresh network namespace (`unshare -n`), brings its loopback up, runs the script with the
arguments given and then the command. Used by tests/test_quick_loopback.py and the benchmarks'
`--quick-loopback` (benchmarks/loopback.py). Needs root, `unshare` and `ip`.
"""
import os
import shlex
from typing import List, Sequence

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "config",
                      "quick-loopback.sh")


def in_a_namespace(command: Sequence[str], *script_runs: str) -> List[str]:
    """argv running `command` in a new network namespace, after `quick-loopback.sh RUN` for
    each of `script_runs` ("on", "off"; none: the kernel's own loopback routes)."""
    steps = ["ip link set lo up"]
    steps += [f"sh {shlex.quote(SCRIPT)} {shlex.quote(run)} >/dev/null" for run in script_runs]
    steps.append("exec " + " ".join(shlex.quote(part) for part in command))
    return ["unshare", "-n", "sh", "-ec", " && ".join(steps)]
