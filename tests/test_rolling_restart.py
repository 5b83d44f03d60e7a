"""A rolling restart (issue 27, part 4): two genuine hivemind-core 5.x replicas (`hivemind-core
listen`, config/server-replica-shared-db.json) sharing a real redis-server behind a real haproxy
from config/haproxy.cfg; each replica in turn gets SIGTERM, drains, exits and is started again,
while conversations of our client take turns through haproxy. No turn is lost, none runs twice
(every engine run is logged with its process id, tests/engines.RunLogEngine, so the count
survives the restarts), and each conversation's history has each of its turns once. A turn
running on the replica at its SIGTERM is finished there; a turn that reaches it during the
drain is refused and run on the other replica. And a 4.0.0 hub drains and exits too."""
import json
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest
from hubs import HubProcess, plugin_config
from replicas import ReplicaSet
from waiting import wait_until

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.bridges.front_metrics import FrontMetrics

pytestmark = pytest.mark.hub

CONVERSATIONS = 4
INFLIGHT = 8     # sentences, 0.5 s apart, of the turn running at SIGTERM: every check of the
                 # drain below (not ready, the idle close, haproxy's NOLB) comes before its end


def readyz(port, query="?not_ready=404"):
    """The status of the replica's `/readyz` as config/haproxy.cfg asks it (not ready: 404),
    or with another `query` ("": as Kubernetes asks, 503); None once nothing answers."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/readyz{query}",
                                     headers={"Host": "localhost"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def runs(path):
    """[(pid, utterance)] of every engine run, in order, from the replicas' shared log."""
    try:
        with open(path) as f:
            return [tuple(line.rstrip("\n").split(" ", 1)) for line in f if " " in line]
    except FileNotFoundError:
        return []


class Load:
    """CONVERSATIONS conversations taking turns through haproxy, one thread each, with one
    agent (its connections shared by the sessions, as 5.x allows), until stopped."""

    def __init__(self, deployment):
        self.agent = HiveMindChatAgent(deployment.agent_config(timeout=30))
        self.stop = threading.Event()
        self.asked = {f"talk{c}": [] for c in range(CONVERSATIONS)}
        self.failures, self.slowest = [], 0.0
        self.threads = [threading.Thread(target=self._talk, args=(sid,), daemon=True)
                        for sid in self.asked]

    def _talk(self, sid):
        n = 0
        while not self.stop.is_set():
            n += 1
            text = f"slow 2 0.2 {sid}-{n}"
            started = time.monotonic()
            try:
                answer = self.agent.get_response(text, session_id=sid)
                assert answer == "slow sentence 1\nslow sentence 2", answer
                self.asked[sid].append(text)
            except Exception as e:      # a lost turn: counted, reported
                self.failures.append((text, f"{type(e).__name__}: {e}"))
            self.slowest = max(self.slowest, time.monotonic() - started)

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(60)


def pinned_agent(deployment, hub):
    """An agent whose (shared) connection haproxy gave to `hub`: the other server disabled
    while it connects."""
    others = [deployment.name(h) for h in deployment.running if h is not hub]
    for name in others:
        deployment.proxy.command(f"disable server hubs/{name}")
    try:
        agent = HiveMindChatAgent(deployment.agent_config(timeout=30))
        assert agent.get_response(f"hello {deployment.name(hub)}", session_id="pin")
    finally:
        for name in others:
            deployment.proxy.command(f"enable server hubs/{name}")
    deployment.proxy.wait_until(lambda s: all(s[n]["status"] == "UP" for n in others))
    return agent


def idle_satellite(hub, creds):
    """A stock hivemind-bus-client satellite connected straight to `hub` and left idle, named
    after `creds` (hivemind-core logs its close with that name)."""
    from hivemind_bus_client.client import HiveMessageBusClient
    from raw_satellite import satellite_identity
    client = HiveMessageBusClient(key=creds.key, password=creds.password, host="ws://127.0.0.1",
                                  port=hub.port, useragent="idle", identity=satellite_identity())
    client.connect()
    assert wait_until(client.handshake_event.is_set, 20)
    return client


def closed_by_hub(hub, name) -> bool:
    """Whether hivemind-core logged the close of client `name`'s connection (the close
    handshake done: the satellite answered the hub's close frame)."""
    return any("disconnecting client" in line and f"::{name}::" in line
               for line in hub.logs().splitlines())


def restart_one(deployment, hub, log_path, pids):
    """SIGTERM `hub` with a turn running there, an idle stock satellite, and another turn sent
    to it during the drain: both turns answered, the first by `hub`, the second by the other
    replica; the idle satellite closed while `hub` still drains. Start it again."""
    name = deployment.name(hub)
    probe = pinned_agent(deployment, hub)
    seen = FrontMetrics("openai")      # what a front's metrics count of the probe's client
    probe.observe(seen)
    idle_name, idle = f"idle-{name}-{len(pids[name])}", None    # its own in every round
    running = f"slow {INFLIGHT} 0.5 inflight-{name}"
    try:
        idle = idle_satellite(hub, deployment.hubs[0].add_client(name=idle_name))
        inflight = probe.begin([{"role": "user", "content": running}],
                               session_id=f"inflight-{name}")
        assert wait_until(lambda: any(u == running for _, u in runs(log_path)), 10)
        signalled = time.monotonic()
        hub.proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: readyz(hub.health_port) in (404, None), 5, poll=0.01), \
            hub.logs()[-4000:]
        not_ready = time.monotonic() - signalled
        # the idle satellite is closed by the drain at once, not by the process's exit
        assert wait_until(lambda: closed_by_hub(hub, idle_name), 5, poll=0.02)
        assert hub.proc.poll() is None
        assert readyz(hub.health_port, "") == 503         # what any other prober is told
        # haproxy read the 404 as "drain": no new connection, the open ones kept (NOLB)
        assert deployment.proxy.wait_until(lambda s: s[name]["status"] == "NOLB", 5), \
            deployment.proxy.servers()
        # the probe's connection is busy with the turn in flight, so it is still open: this
        # turn reaches the draining replica, which refuses it; the client sends it again
        arrived = probe.get_response(f"slow 1 0.1 arrive-{name}", session_id=f"arrive-{name}")
        assert arrived == "slow sentence 1"
        assert (seen.registry.get_sample_value("hivemind_chat_client_resends_total", {
            "front": "openai", "reason": "draining"}) or 0) >= 1
        assert list(inflight) == [f"slow sentence {i}" for i in range(1, INFLIGHT + 1)]
        assert inflight.status.value == "answered"
    finally:
        probe.shutdown()
        if idle is not None:
            idle.close()
    code = hub.proc.wait(40)
    exited = time.monotonic() - signalled
    where = {}
    for pid, utterance in runs(log_path):
        where.setdefault(utterance, []).append(pid)
    here = str(pids[name][-1])
    assert where[running] == [here]                                 # finished there, once
    assert here not in where[f"slow 1 0.1 arrive-{name}"]          # run elsewhere
    assert len(where[f"slow 1 0.1 arrive-{name}"]) == 1
    drained = re.findall(r"drained in ([0-9.]+) s: (\d+) turns finished, (\d+) cut at "
                         r"drain_timeout, (\d+) refused", hub.logs())
    assert drained, hub.logs()[-3000:]
    seconds, finished, cut, refused = drained[-1]
    assert int(cut) == 0 and int(refused) >= 1, drained[-1]
    print(f"{name}: not ready {not_ready * 1000:.0f} ms after SIGTERM, drained in {seconds} s "
          f"({finished} turns finished, {refused} refused), exited {exited:.2f} s after it "
          f"with code {code}")
    deployment.restart(hub)
    pids[name].append(hub.proc.pid)
    return code


@pytest.fixture
def rolling(tmp_path):
    log_path = str(tmp_path / "ran.log")
    replicas = ReplicaSet(str(tmp_path), engine="engines:RunLogEngine",
                          engine_config={"ran_log": log_path}, history_turns=200,
                          history_bytes=200000).start()
    replicas.ran_log = log_path
    yield replicas
    replicas.stop()


def test_a_rolling_restart_loses_no_turn_runs_none_twice_and_forgets_no_conversation(rolling):
    deployment = rolling
    warm = HiveMindChatAgent(deployment.agent_config(timeout=30))
    try:
        assert warm.get_response("hello", session_id="warm") == "hello there"
    finally:
        warm.shutdown()
    deployment.add_replica()
    pids = {deployment.name(h): [h.proc.pid] for h in deployment.running}
    load = Load(deployment).start()
    try:
        time.sleep(2)
        codes = []
        for hub in list(deployment.running):
            codes.append(restart_one(deployment, hub, deployment.ran_log, pids))
            time.sleep(2)
    finally:
        load.finish()
    try:
        asked = [t for turns in load.asked.values() for t in turns]
        counts = Counter(u for _, u in runs(deployment.ran_log))
        twice = [t for t in asked if counts[t] > 1]
        never = [t for t in asked if counts[t] == 0]
        print(f"{len(asked)} turns answered of {len(asked) + len(load.failures)}, "
              f"{len(load.failures)} lost, {len(twice)} run twice; slowest turn "
              f"{load.slowest:.2f} s")
        assert not load.failures, load.failures[:5]
        assert not twice and not never, (twice[:5], never[:5])
        assert all(len(turns) >= 5 for turns in load.asked.values()), load.asked
        assert codes == [0, 0]
        for sid, turns in load.asked.items():   # each conversation's memory, whole
            history = json.loads(load.agent.get_response("history", session_id=sid))
            users = [text for role, text in history if role == "user"]
            assert users == turns, (sid, users[-5:], turns[-5:])
    finally:
        load.agent.shutdown()


def test_a_4_0_hub_drains_its_running_turn_and_exits_on_sigterm():
    hub = HubProcess(agent_protocol=plugin_config(drain_timeout=20), generation="4.0").start()
    try:
        creds = hub.add_client(name="drain-4")
        agent = HiveMindChatAgent(creds.agent_config(timeout=20))
        try:
            assert agent.get_response("hello", session_id="s") == "hello there"
            turn = agent.begin([{"role": "user", "content": "slow 3 0.5"}], session_id="s")
            time.sleep(0.3)
            signalled = time.monotonic()
            hub.proc.send_signal(signal.SIGTERM)
            assert list(turn) == ["slow sentence 1", "slow sentence 2", "slow sentence 3"]
            assert turn.status.value == "answered"
        finally:
            agent.shutdown()
        assert hub.proc.wait(30) == 0
        exited = time.monotonic() - signalled
        logs = hub.logs()
        assert "drained in" in logs and "1 turns finished, 0 cut" in logs, logs[-3000:]
        drained = re.findall(r"drained in [^\n]*", logs)[-1]
        print(f"4.0.0: exited {exited:.2f} s after SIGTERM; {drained}")
    finally:
        hub.cleanup()
