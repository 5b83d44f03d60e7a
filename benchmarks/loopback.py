"""`--quick-loopback` for the benchmarks of the OVOS bus: the run moved into a network namespace
of its own whose loopback route has config/quick-loopback.sh's `quickack`, so that every bus
client (ovos-core's own among them) acknowledges at once and ovos-messagebus's Nagle holds
nothing (docs/performance.md). This machine's routes are never touched: the namespace goes
with the run. Needs root, `unshare` and `ip`; the hubs, buses and clients all run inside it.
"""
import os
import shlex
import subprocess
import sys
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "config", "quick-loopback.sh")
INSIDE = "HIVEMIND_CHAT_QUICK_LOOPBACK"     # set in the namespace's run


def add_option(parser) -> None:
    parser.add_argument("--quick-loopback", action="store_true",
                        help="run in a network namespace whose loopback acknowledges at once "
                             "(config/quick-loopback.sh): the bus's 40 ms stalls removed "
                             "for every client, as an operator's hub with the script has it")


def in_quick_loopback() -> bool:
    return os.environ.get(INSIDE) == "1"


def rerun_inside(argv: List[str]) -> int:
    """This script again, with `argv`, in a new network namespace with the quick route; its
    exit code."""
    command = " ".join(shlex.quote(a) for a in [sys.executable, *argv])
    steps = f"ip link set lo up && sh {shlex.quote(SCRIPT)} >/dev/null && exec {command}"
    return subprocess.call(["unshare", "-n", "sh", "-ec", steps],
                           env={**os.environ, INSIDE: "1"})


def maybe_rerun(args) -> None:
    """With `--quick-loopback` and not inside yet: the run happens in the namespace and this
    process exits with its code."""
    if getattr(args, "quick_loopback", False) and not in_quick_loopback():
        sys.exit(rerun_inside(sys.argv))
