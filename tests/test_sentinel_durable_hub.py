"""`store_durable` through a genuine 5.x hub under Redis Sentinel (issue 27: "in durable mode:
nothing answered is forgotten"): ten conversations take turns with our client while the
replica lags (SIGSTOP, the primary's replication link cut: on loopback a replica is otherwise
never far enough behind to lose anything), then the primary gets kill -9 and the replica,
going on, is promoted. Durable: every turn the client was told answered is in its
conversation's history afterwards, exactly once (those that ended while the replica lagged
were told `store_unavailable` instead). Plain: answers given during the lag are gone, which is
what the durable mode is for. The store-level twin is in tests/test_store_durable.py."""
import json
import os
import signal
import threading
import time

import pytest
import redis
from replicas import replica
from sentinels import SentinelSet
from waiting import wait_until

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.errors import ConversationStoreError

pytestmark = pytest.mark.hub
NAMES = ["Ada", "Bob", "Cy", "Dee", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jo"]
FAILOVER_BOUND = 90.0     # seconds for the promotion (and a rejoin) on a loaded machine
PACE = 0.05               # seconds between one conversation's turns
WRITE_AFTER = 2.0         # seconds a plain exchange's write may follow its answer's end


class Conversations:
    """Ten conversations taking turns on threads of their own: `answered[name]` holds the
    utterances the client was told answered (with when they began and ended), `failed[name]`
    the errors' texts; every turn's duration is checked against the timeout."""

    def __init__(self, agent: HiveMindChatAgent):
        self.agent = agent
        self.answered = {name: [] for name in NAMES}
        self.failed = {name: [] for name in NAMES}
        self.slowest = 0.0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._converse, args=(n,), daemon=True)
                         for n in NAMES]

    def _converse(self, name: str) -> None:
        turn = 0
        while not self._stop.is_set():
            turn += 1
            utterance, started = f"hello {name} {turn}", time.monotonic()
            try:
                answer = self.agent.get_response(utterance, session_id=f"room-{name}")
                assert answer == "hello there", answer
                self.answered[name].append((started, time.monotonic(), utterance))
            except ConversationStoreError as e:     # store_unavailable; anything else fails
                self.failed[name].append(str(e))
            self.slowest = max(self.slowest, time.monotonic() - started)
            time.sleep(PACE)

    def start(self) -> "Conversations":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.ident is not None:       # started
                thread.join(30)

    def count(self) -> int:
        return sum(map(len, self.answered.values()))

    def all_answered_since(self, moment: float) -> bool:
        return all(any(s > moment for s, _, _ in kept) for kept in self.answered.values())


def lag_the_replica(sentinel: SentinelSet) -> None:
    """The replica stops (SIGSTOP) and the primary drops its replication link: what the
    primary writes from now on stays there."""
    os.kill(sentinel.replica.process.pid, signal.SIGSTOP)
    primary = redis.Redis(port=sentinel.primary.port, socket_timeout=2)
    try:
        primary.client_kill_filter(_type="slave")
    finally:
        primary.close()


def fail_over(sentinel: SentinelSet, durable: bool) -> None:
    """kill -9 of the primary, the replica going on, and its promotion; durable: the old
    primary back (empty, as after a disk loss) as the promoted one's replica, since a durable
    write needs one to acknowledge it; never promoted (SentinelSet.bring_back_primary: a
    diskless full sync waits 5 s, and a second failover to it meanwhile would wipe the
    promoted one)."""
    promoted = ("127.0.0.1", sentinel.replica.port)
    sentinel.primary.kill()
    os.kill(sentinel.replica.process.pid, signal.SIGCONT)
    assert wait_until(lambda: sentinel.primary_address() == promoted, FAILOVER_BOUND)
    if durable:
        sentinel.bring_back_primary(replica_of=promoted)


def histories(agent: HiveMindChatAgent) -> "dict[str, list[str]]":
    """Each conversation's user utterances as its history has them (the engine's `history`
    command: what came before, as the hub gave it to the engine)."""
    out = {}
    for name in NAMES:
        before = json.loads(agent.get_response("history", session_id=f"room-{name}"))
        out[name] = [content for role, content in before if role == "user"]
    return out


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "plain"])
def test_through_a_hub_no_answered_turn_is_forgotten_in_a_failover_when_durable(durable,
                                                                               tmp_path):
    sentinel = SentinelSet(str(tmp_path)).start()
    hub = replica(sentinel.url, engine="engines:ScriptEngine", history_turns=1000,
                  history_bytes=10 ** 6, store_durable=durable)
    agent = conversations = None
    try:
        hub.start()
        agent = HiveMindChatAgent(hub.add_client(name="durable").agent_config(timeout=20))
        conversations = Conversations(agent)
        assert wait_until(sentinel.in_sync, 10)
        conversations.start()
        assert wait_until(lambda: all(len(k) >= 3 for k in conversations.answered.values()),
                          60)
        before, lag_began = conversations.count(), time.monotonic()
        lag_the_replica(sentinel)
        failures = sum(map(len, conversations.failed.values()))
        assert wait_until(lambda: conversations.count() > before + 30 or sum(
            map(len, conversations.failed.values())) > failures + 30, 30)
        fail_over(sentinel, durable)
        after = time.monotonic()
        assert wait_until(lambda: conversations.all_answered_since(after), FAILOVER_BOUND), \
            {n: (k[-1:], conversations.failed[n][-1:]) for n, k in
             conversations.answered.items()}
        conversations.stop()
        kept = histories(agent)
    finally:
        if conversations is not None:
            conversations.stop()
        if agent is not None:
            agent.shutdown()
        hub.cleanup()
        if sentinel.replica.process and sentinel.replica.process.poll() is None:
            os.kill(sentinel.replica.process.pid, signal.SIGCONT)
        sentinel.stop()
    assert conversations.slowest < 25          # the turn's timeout, never a hang
    # answered while the replica lagged, or just before (a plain write follows the answer)
    during_lag = [u for name, k in conversations.answered.items() for s, e, u in k
                  if e >= lag_began - WRITE_AFTER and s < after]
    forgotten = [(name, u) for name, k in conversations.answered.items() for _, _, u in k
                 if kept[name].count(u) != 1]
    failed = sum(map(len, conversations.failed.values()))
    print(f"{'durable' if durable else 'plain'} through a hub: {conversations.count()} turns "
          f"answered ({len(during_lag)} while the replica lagged), {failed} failed, "
          f"{len(forgotten)} answered ones not in their history once")
    if durable:
        assert forgotten == [] and failed > 0
    else:
        assert forgotten and {u for _, u in forgotten} <= set(during_lag)
