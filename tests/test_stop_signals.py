"""hub/stop_signals.relay_to_main_thread: a SIGTERM that another thread of the process caught
still wakes hivemind-core's main thread, which waits as `ovos_utils.wait_for_exit_signal` waits
(a Python handler setting an Event). A process of its own plays hivemind-core: code of a module
named `hivemind_core.service` builds the relay, the main thread waits, and a worker thread
sends SIGTERM to itself (a thread-directed signal lands on that thread, as the kernel may hand
a process-directed one to any thread that does not block it). Without the relay the main
thread sleeps through it, which is how 2 of 12 SIGTERMs of a 5.x hub in OVOS mode were lost."""
import subprocess
import sys
import textwrap

import pytest

PLAYED_HUB = textwrap.dedent("""
    import signal, sys, threading, time, types
    from hivemind_chat_agent.hub.stop_signals import relay_to_main_thread
    service = types.ModuleType("hivemind_core.service")
    sys.modules["hivemind_core.service"] = service       # loaded, as the demo loads it too
    exec("def build(relay):\\n    return relay()", service.__dict__)
    if sys.argv[1] == "embedded":                        # the embedder builds the plugin
        print("relay" if relay_to_main_thread() else "no relay")
        sys.exit(0)
    if sys.argv[1] == "relay":                           # hivemind-core builds it
        assert service.build(relay_to_main_thread)
        assert service.build(relay_to_main_thread)      # once per process
    exit_event = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: exit_event.set())   # as wait_for_exit_signal

    def caught_off_the_main_thread():
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    threading.Thread(target=caught_off_the_main_thread, daemon=True).start()
    started = time.monotonic()
    exit_event.wait()
    print(f"woke after {time.monotonic() - started:.2f} s", flush=True)
""")


def run(mode: str, timeout: float):
    try:
        done = subprocess.run([sys.executable, "-c", PLAYED_HUB, mode], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_sigterm_caught_by_another_thread_wakes_the_main_thread_with_the_relay():
    woke = run("relay", timeout=20)
    assert woke is not None and woke.startswith("woke after"), woke


def test_without_the_relay_the_main_thread_sleeps_through_it():
    """What the relay is for: the same process without it never wakes."""
    assert run("none", timeout=3) is None


def test_no_relay_outside_hivemind_cores_service():
    """An embedder (hivemind-chat demo, LocalHub) keeps its own handlers to itself, though it
    has `hivemind_core.service` loaded: else its Ctrl-C runs twice."""
    assert run("embedded", timeout=20) == "no relay\n"


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Send `sig` to thread `tid` of process `pid` (Linux's tgkill: the kernel's choice of a
    thread for a process-directed signal, made by hand)."""
    import ctypes
    import os
    import platform
    number = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
    if number is None:
        pytest.skip(f"tgkill's syscall number on {platform.machine()} is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _blocks(pid: int, tid: int, sig: int) -> bool:
    """Whether thread `tid` blocks `sig` (then the kernel never hands it a process-directed
    one: ours block SIGTERM, hivemind-core's and the libraries' threads do not)."""
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        mask = next(line.split()[1] for line in f if line.startswith("SigBlk:"))
    return bool(int(mask, 16) & (1 << (sig - 1)))


@pytest.mark.hub
def test_a_genuine_hub_stops_on_a_sigterm_that_another_of_its_threads_caught(generation):
    """Where the relay is meant to run: hivemind-core's own `listen` built the plugin, so a
    SIGTERM landing on any other thread of the hub still ends it (without the relay it slept
    through such a signal; with the relay at the wrong place, the demo's Ctrl-C ran twice)."""
    from hubs import HubProcess, plugin_config
    hub = HubProcess(plugin_config(), generation=generation).start()   # `hivemind-core listen`
    try:
        _stops_on_a_sigterm_off_its_main_thread(hub)
    finally:
        hub.cleanup()


def _stops_on_a_sigterm_off_its_main_thread(hub) -> None:
    import os
    import signal
    pid = hub.proc.pid
    others = [tid for tid in map(int, os.listdir(f"/proc/{pid}/task"))
              if tid != pid and not _blocks(pid, tid, signal.SIGTERM)]
    assert others, "the hub runs threads that take SIGTERM besides its main one"
    _tgkill(pid, others[-1], signal.SIGTERM)
    try:
        hub.proc.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail("the hub slept through a SIGTERM caught off its main thread")
