"""config/quick-loopback.sh, the operator's fix for ovos-messagebus's 40 ms stalls of every bus
client (docs/performance.md), run for real: in a network namespace of its own (`unshare -n`,
so this machine's routes are never touched), then a plain websocket-client connection on
tests/echo_bus.py's bus (Nagle on, every message echoed, as ovos-messagebus does). The
kernel's own counts say whether each echo was acknowledged as it was read: all of them with
the script's route, not so without it. No clock is read. And the OVOS mode's warning of a
route without it, with the namespace's real `ip`.
"""
import os
import shutil
import subprocess
import sys

import pytest
from echo_bus import TURNS
from quick_route import SCRIPT, in_a_namespace

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0
    or not shutil.which("unshare") or not shutil.which("ip"),
    reason="needs Linux, root, unshare and ip (a network namespace of the test's own)")


def acks_in_a_namespace(*script_runs: str) -> int:
    """echo_bus.plain_client_acks() in a fresh network namespace whose loopback is up, after
    `quick-loopback.sh RUN` for each of `script_runs`."""
    done = subprocess.run(in_a_namespace([sys.executable, os.path.join(HERE, "echo_bus.py")],
                                         *script_runs),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


def test_the_route_makes_a_plain_bus_client_acknowledge_every_echo_at_once():
    assert acks_in_a_namespace("on") == TURNS


def test_without_it_a_plain_client_delays_its_acks_and_off_undoes_it():
    assert acks_in_a_namespace() < TURNS
    assert acks_in_a_namespace("on", "off") < TURNS


def test_the_script_refuses_what_it_does_not_know():
    done = subprocess.run(["sh", SCRIPT, "maybe"], capture_output=True, text=True, timeout=10)
    assert done.returncode == 2 and "usage" in done.stderr


# the OVOS mode's warning (hub/bus_socket.check_route), asking this namespace's real
# `ip` about a real connection to 127.0.0.1: prints whether it warned
WARNS = """
import socket
from hivemind_chat_agent.hub.bus_socket import check_route
listener = socket.create_server(("127.0.0.1", 0))
with socket.create_connection(listener.getsockname()) as sock:
    print(check_route(sock.getpeername()[0]))
"""


def warns_in_a_namespace(*script_runs: str) -> bool:
    done = subprocess.run(in_a_namespace([sys.executable, "-c", WARNS], *script_runs),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return {"True": True, "False": False}[done.stdout.strip().splitlines()[-1]]


def test_the_ovos_mode_warns_of_a_loopback_route_without_quickack_and_only_then():
    assert warns_in_a_namespace() is True
    assert warns_in_a_namespace("on") is False
    assert warns_in_a_namespace("on", "off") is True
