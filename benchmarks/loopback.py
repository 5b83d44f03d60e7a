"""`--quick-loopback` for the benchmarks of the OVOS bus: the run moved into a network namespace
of its own whose loopback route has config/quick-loopback.sh's `quickack`, so that every bus
client (ovos-core's own among them) acknowledges at once and ovos-messagebus's Nagle holds
nothing (docs/performance.md). This machine's routes are never touched: the namespace goes
with the run. Needs root, `unshare` and `ip`; the hubs, buses and clients all run inside it.
"""
import os
import subprocess
import sys
from typing import List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from quick_route import in_a_namespace  # noqa: E402

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
    return subprocess.call(in_a_namespace([sys.executable, *argv], "on"),
                           env={**os.environ, INSIDE: "1"})


def maybe_rerun(args) -> None:
    """With `--quick-loopback` and not inside yet: the run happens in the namespace and this
    process exits with its code; inside, the run says so first."""
    if in_quick_loopback():
        print("loopback with quickack (config/quick-loopback.sh), in a network namespace",
              flush=True)
    elif getattr(args, "quick_loopback", False):
        sys.exit(rerun_inside(sys.argv))
