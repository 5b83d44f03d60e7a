import logging
import os
import shutil
import signal
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hubs import HubProcess, hub_generations  # noqa: E402
from leaks import agent_threads  # noqa: E402, F401 (test_client_faults imports it from here)

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402

# run inside the Home Assistant chroot by test_home_assistant_harness.py, not here
collect_ignore = ["ha_component"]

# fixtures that start a real hub, an OVOS stack or a venv: a test that uses one is a `hub` test
HUB_FIXTURES = {"generation", "hub", "creds", "own_hub", "chat_hub", "sat_a", "sat_b", "hub5",
                "ovos", "ovos_creds", "stop_hub", "proxy", "served", "persona", "stable_ovos",
                "current_ovos_hub", "wheel", "redis_server", "deployment", "redis_cluster",
                "shared_redis"}


_OWN_BASETEMP = []   # the temporary folder this run made for itself, if it made one
_LEFT_RUNNING = []   # the folders of processes a test left running (pytest_sessionfinish)


def deliver_ctrl_c():
    """Tests press Ctrl-C (a real SIGINT to this process, or to a CLI in a pseudo-terminal), so
    SIGINT must be delivered. A runner started in the background of a script (`cmd &` without
    job control) inherits SIGINT ignored, Python then installs no KeyboardInterrupt, and every
    child keeps it ignored across exec: all five Ctrl-C tests failed in such a run while the
    code was fine. Handing SIGINT back to Python's own handler here also lets the children get
    the default again (a handler, unlike an ignored signal, does not survive exec)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


deliver_ctrl_c()


def pytest_configure(config):
    """Each run gets a temporary folder of its own. pytest's numbered folders
    (/tmp/pytest-of-<user>/pytest-N) are shared by every run of the user, and a run that
    starts deletes the older ones: the folders of a run still going (its copied venvs, its hubs'
    homes) vanished under it when the quick loop ran beside the whole suite. A folder made for
    this run is no other run's to delete. It goes when the run passes and stays when it fails,
    with its path in the summary. `--basetemp` still chooses one."""
    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="hivemind-chat-tests-")
        _OWN_BASETEMP.append(config.option.basetemp)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """Servers (redis-server, haproxy, mosquitto), hubs, OVOS stacks and Home Assistant that a
    test left running are stopped here, and the run fails naming them in the summary
    (tests/spawned.py)."""
    from spawned import stop_those_left
    _LEFT_RUNNING.extend(stop_those_left())
    if _LEFT_RUNNING and exitstatus in (0, 5):
        session.exitstatus = exitstatus = pytest.ExitCode.TESTS_FAILED
    if _OWN_BASETEMP and exitstatus in (0, 5):   # passed, or nothing collected
        shutil.rmtree(_OWN_BASETEMP.pop(), ignore_errors=True)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus):
    """Last before the final line: the failed tests by name, a line each, at most 200
    characters of their error. CI shows only the end of its output, and pytest's own summary
    there quotes a failed assertion whole (once a hub's log of megabytes)."""
    yield                  # the outermost wrapper: after pytest's own short summary
    if _OWN_BASETEMP and (exitstatus not in (0, 5) or _LEFT_RUNNING):
        terminalreporter.write_line(f"this run's temporary files: {_OWN_BASETEMP[0]}")
    for directory in _LEFT_RUNNING:
        terminalreporter.write_line(f"LEFT RUNNING: the process of {directory} (stopped now)")
    for kind in ("failed", "error"):
        for report in terminalreporter.stats.get(kind, []):
            message = getattr(report.longrepr, "reprcrash", None)
            first = " ".join(str(message.message).split())[:200] if message else ""
            terminalreporter.write_line(f"{kind.upper()}: {report.nodeid} {first}")


def pytest_collection_modifyitems(items):
    """Mark every test that uses a hub fixture `hub`; tests that start one in their body carry
    the mark themselves (the guard below refuses them otherwise)."""
    for item in items:
        if HUB_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.hub)


@pytest.fixture(autouse=True)
def only_hub_tests_start_hubs(request, monkeypatch):
    """The quick loop (`-m "not hub"`) must start nothing: a test without the mark that starts
    a hub or a server (redis-server, haproxy) fails, naming the mark it needs."""
    if request.node.get_closest_marker("hub") is not None:
        return
    from ovos_hub import OVOSHub
    from servers import ServerProcess

    from hivemind_chat_agent.bridges.local_hub import LocalHub

    def refuse(*_args, **_kwargs):
        raise RuntimeError(f"{request.node.nodeid} starts a hub: mark it @pytest.mark.hub")
    for cls in (HubProcess, LocalHub, OVOSHub):
        monkeypatch.setattr(cls, "start", refuse)
    monkeypatch.setattr(ServerProcess, "spawn", refuse)


@pytest.fixture(scope="session", params=hub_generations())
def generation(request):
    """A hivemind-core generation ("4.0" or "5"): tests that use `hub`, `creds` or `own_hub`
    (or this fixture) run once per generation, as test_x[4.0] and test_x[5]."""
    return request.param


@pytest.fixture(scope="session")
def hub(generation):
    """One real hub per generation for the tests that do not break it."""
    h = HubProcess(generation=generation).start()
    yield h
    h.cleanup()


@pytest.fixture(scope="session")
def creds(hub):
    """A client of `hub`, allowed what our client sends (both utterance topics and
    recognizer_loop:audio_output_end on 5.x; the hub's defaults on 4.0)."""
    return hub.add_client()


@pytest.fixture
def own_hub(generation):
    """A hub of this test's own, which it may kill."""
    h = HubProcess(generation=generation).start()
    yield h
    h.cleanup()


@pytest.fixture
def make_agent():
    agents = []

    def make(config, **extra):
        agent = HiveMindChatAgent({**config, **extra})
        agents.append(agent)
        return agent
    yield make
    for agent in agents:
        agent.shutdown()


@pytest.fixture
def warnings_of_ours(monkeypatch):
    """Every WARNING or worse that our package logs during the test."""
    records = []
    call_handlers = logging.Logger.callHandlers

    def spy(logger, record):
        # ovos_utils' LOG logs from its own module, naming the caller's in the logger name
        if record.levelno >= logging.WARNING and "hivemind_chat_agent" in (record.name or ""):
            records.append(record.getMessage())
        return call_handlers(logger, record)
    monkeypatch.setattr(logging.Logger, "callHandlers", spy)
    return records


@pytest.fixture
def redis_server(tmp_path):
    """A redis-server of the test's own on a free loopback port (tests/servers.py)."""
    from servers import RedisServer
    server = RedisServer(str(tmp_path / "redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_tls(tmp_path):
    """(CA file, certificate, key) for Redis servers on 127.0.0.1: a CA made for this test
    (tests/test_tls.py's `issue`) and a certificate it signed for that address."""
    from test_tls import issue
    ca = issue(str(tmp_path / "pki"), "ca", ca=True)
    cert = issue(str(tmp_path / "pki"), "redis", ips=["127.0.0.1"], issuer=ca)
    return ca.cert_path, cert.cert_path, cert.key_path


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A Redis Cluster of three primaries (tests/clusters.py) for the run's store tests, each
    starting it empty (`shared_redis`); a test that breaks a cluster starts its own."""
    from clusters import RedisClusterSet
    cluster = RedisClusterSet(str(tmp_path_factory.mktemp("redis-cluster"))).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def shared_redis(request):
    """The Redis a store test runs on: "redis" (the default: the `redis_server` fixture) or
    "cluster" (`redis_cluster`, emptied), by indirect parametrization."""
    from clusters import SharedRedis
    if getattr(request, "param", "redis") == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        shared = SharedRedis(cluster.url, cluster)
        shared.flush()
    else:
        shared = SharedRedis(request.getfixturevalue("redis_server").url)
    yield shared
    shared.close()
