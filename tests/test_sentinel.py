"""The conversation store behind Redis Sentinel (hub/redis_urls.py): Debian's redis-server as a
primary, a replica and three sentinels (tests/sentinels.py); the primary killed with -9 while
conversations go on. What was replicated before the kill is still there after the promotion,
every call during the failover ends within the store's timeouts (answered or
ConversationStoreError, none hangs), and the conversations then continue by themselves, first
through RedisStore itself, then through a genuine 5.x hub and our client: with the kill
between turns, and with ten conversations taking turns on threads of their own as it lands."""
import time

import pytest
from sentinels import SentinelSet
from waiting import wait_until

from hivemind_chat_agent.core.transcript import ANSWERED, Exchange
from hivemind_chat_agent.errors import ConversationStoreError
from hivemind_chat_agent.hub.conversation_store import REDIS_TIMEOUT
from hivemind_chat_agent.hub.redis_store import RedisStore

pytestmark = pytest.mark.hub
CONVERSATIONS = 10
FAILOVER_BOUND = 90.0     # seconds for the promotion on a loaded machine (about 2-5 s idle)
CALL_BOUND = 4 * REDIS_TIMEOUT + 2   # connect, sentinel lookups, the command: never a hang
PACE = 0.2                # seconds between a caller's rounds once the store has failed
NAMES = ["Ada", "Bob", "Cy", "Dee", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jo"][:CONVERSATIONS]


@pytest.fixture
def sentinel(request, tmp_path):
    """The Sentinel deployment; "tls" as the test's parameter: every server on TLS too, and
    the URL the rediss+sentinel:// one trusting the test's CA."""
    tls = request.getfixturevalue("redis_tls") if getattr(request, "param", "") == "tls" \
        else None
    deployment = SentinelSet(str(tmp_path), tls=tls).start()
    yield deployment
    deployment.stop()


def timed(call, *args):
    started = time.monotonic()
    try:
        return call(*args), time.monotonic() - started
    except ConversationStoreError as e:
        return e, time.monotonic() - started


def tell_names(agent, names) -> None:
    """Each session of `names` ({session: name}) tells its name."""
    for session, name in names.items():
        assert name in agent.get_response(f"my name is {name}", session_id=session)


def recalled_after_the_kill(agent, names, sentinel) -> "tuple[dict, int]":
    """kill -9 of the primary once the replica has everything, then "what is my name" in each
    session of `names` until each is answered (FAILOVER_BOUND at most): the answers by
    session, and how many turns failed with the store meanwhile (any other error fails, and
    no turn may outlast its timeout)."""
    assert wait_until(sentinel.in_sync, 10)
    sentinel.primary.kill()
    remembered, failed, deadline = {}, 0, time.monotonic() + FAILOVER_BOUND
    while len(remembered) < len(names) and time.monotonic() < deadline:
        if failed:
            time.sleep(PACE)
        for session in [s for s in names if s not in remembered]:
            started = time.monotonic()
            try:
                remembered[session] = agent.get_response("what is my name", session_id=session)
            except ConversationStoreError:     # store_unavailable, while it fails over
                failed += 1
            assert time.monotonic() - started < 25     # the turn's timeout, never more
    return remembered, failed


def test_the_store_follows_the_promoted_replica_and_keeps_what_was_replicated(sentinel):
    store = RedisStore(sentinel.url, history_turns=50, history_bytes=10 ** 6, session_ttl=600)
    sessions = [f"conversation-{i}" for i in range(CONVERSATIONS)]
    kept = {s: [Exchange(f"before {s}", "answered", ANSWERED)] for s in sessions}
    try:
        for s in sessions:
            store.record(s, kept[s][0])
        assert wait_until(sentinel.in_sync, 10)
        old = sentinel.primary_address()
        sentinel.primary.kill()
        failed, slowest, round_ = 0, 0.0, 0
        waiting = set(sessions)          # no turn answered since the kill yet
        killed = time.monotonic()
        deadline = killed + FAILOVER_BOUND
        while waiting and time.monotonic() < deadline:
            round_ += 1
            if failed:
                time.sleep(PACE)         # a caller's pace, not a wait for anything
            for s in sessions:
                exchange = Exchange(f"after {s} {round_}", "answered", ANSWERED)
                result, took = timed(store.record, s, exchange)
                slowest = max(slowest, took)
                if isinstance(result, ConversationStoreError):
                    failed += 1
                    assert "redis+sentinel://" in str(result) and "turns fail" in str(result)
                    continue
                kept[s].append(exchange)
                waiting.discard(s)
        assert not waiting, f"no answer since the kill for {sorted(waiting)}"
        assert sentinel.primary_address() != old
        assert slowest < CALL_BOUND, slowest
        for s in sessions:               # what a failed call may have written is not asserted
            history = store.history(s)
            assert history[0] == kept[s][0]
            answered = [e for e in history if e in kept[s]]
            assert answered == kept[s], (s, history)
        print(f"failover: all {CONVERSATIONS} answered again {time.monotonic() - killed:.1f} s "
              f"after the kill; {failed} calls failed with ConversationStoreError meanwhile, "
              f"the slowest call took {slowest:.2f} s")
    finally:
        store.close()


@pytest.mark.parametrize("sentinel", ["plain", "tls"], indirect=True)
def test_conversations_through_a_hub_continue_with_their_history_after_the_failover(sentinel):
    """Ten conversations, the primary killed between turns: each is answered again from its
    history once the replica is promoted; with TLS the hub reaches the sentinels and both
    Redis only over it (rediss+sentinel://, the CA in the URL's ssl_ca_certs)."""
    from replicas import replica

    from hivemind_chat_agent import HiveMindChatAgent
    hub = replica(sentinel.url).start()
    try:
        creds = hub.add_client(name="sentinel")
        agent = HiveMindChatAgent(creds.agent_config(timeout=20))
        names = {f"room-{i}": name for i, name in enumerate(NAMES)}
        try:
            tell_names(agent, names)
            remembered, failed = recalled_after_the_kill(agent, names, sentinel)
            assert remembered == {s: f"Your name is {n}." for s, n in names.items()}
            print(f"through the hub: {failed} turns failed with the store while it failed over")
        finally:
            agent.shutdown()
    finally:
        hub.cleanup()


def test_turns_in_flight_when_the_primary_dies_end_and_every_conversation_goes_on(sentinel):
    """The issue's case as it happens: ten conversations keep taking turns, each on its own
    thread, while the primary is killed. Every turn ends within its timeout (answered, or
    failed naming the store; none hangs), and each conversation is answered again after the
    kill with what it said before it."""
    import threading

    from replicas import replica

    from hivemind_chat_agent import HiveMindChatAgent
    hub = replica(sentinel.url).start()
    names = NAMES
    turns = {name: [] for name in names}     # (started, took, answer or error text)
    stop, threads = threading.Event(), []
    try:
        agent = HiveMindChatAgent(hub.add_client(name="sentinel-load").agent_config(timeout=20))

        def converse(name):
            session = f"room-{name}"
            while not stop.is_set():
                started = time.monotonic()
                try:
                    answer = agent.get_response("what is my name", session_id=session)
                except ConversationStoreError as e:     # store_unavailable: any other fails
                    answer = f"failed: {e}"
                turns[name].append((started, time.monotonic() - started, answer))
                if answer.startswith("failed"):
                    time.sleep(PACE)
        try:
            for name in names:
                assert name in agent.get_response(f"my name is {name}",
                                                  session_id=f"room-{name}")
            assert wait_until(sentinel.in_sync, 10)
            threads += [threading.Thread(target=converse, args=(n,), daemon=True)
                        for n in names]
            for thread in threads:
                thread.start()
            assert wait_until(lambda: all(len(t) >= 3 for t in turns.values()), 60)
            killed = time.monotonic()
            sentinel.primary.kill()

            def answered_since_kill(name):
                return any(s > killed and not a.startswith("failed") for s, _, a in turns[name])
            assert wait_until(lambda: all(map(answered_since_kill, names)), FAILOVER_BOUND), \
                {n: turns[n][-1] for n in names}
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
            agent.shutdown()
    finally:
        hub.cleanup()
    failed = 0
    for name, taken in turns.items():
        for _started, took, answer in taken:
            assert took < 25, (name, took, answer)          # the turn's timeout, never a hang
            if answer.startswith("failed"):
                failed += 1
                assert "store" in answer.lower(), (name, answer)
            else:
                assert answer == f"Your name is {name}.", (name, answer)
    print(f"{sum(map(len, turns.values()))} turns, {failed} failed with the store while it "
          f"failed over; every conversation answered again with its name")


def test_behind_haproxy_a_failover_cuts_no_satellite_and_every_conversation_goes_on(sentinel,
                                                                                   tmp_path):
    """The deployment of docs/scale-out.md on Sentinel: two genuine replicas behind haproxy
    from config/haproxy.cfg (its `/readyz?not_ready=404` check), their clients in a Redis of
    their own. While the primary fails over both replicas are unready at once; haproxy takes
    them out of the balancing (NOLB) but never marks one down, so the satellite's connection
    is not cut: its turns fail naming the store meanwhile, and once the replica is promoted
    every conversation is answered from its history on the connection it had."""
    import threading

    from replicas import ReplicaSet, replica

    from hivemind_chat_agent import HiveMindChatAgent
    from hivemind_chat_agent.bridges.front_metrics import FrontMetrics
    deployment = ReplicaSet(str(tmp_path / "tier"),
                            hub=lambda _url, clients: replica(sentinel.url, clients))
    seen, statuses, watching = FrontMetrics("openai"), set(), threading.Event()

    def watch():
        while not watching.wait(0.1):
            statuses.update(s["status"] for s in deployment.proxy.servers().values())
    watcher = threading.Thread(target=watch, daemon=True)
    try:
        deployment.start()
        agent = HiveMindChatAgent(deployment.agent_config(timeout=20))
        agent.observe(seen)
        try:
            names = {f"room-{i}": name for i, name in enumerate(NAMES[:5])}
            tell_names(agent, names)
            deployment.add_replica()
            watcher.start()
            remembered, failed = recalled_after_the_kill(agent, names, sentinel)
            assert remembered == {s: f"Your name is {n}." for s, n in names.items()}
        finally:
            agent.shutdown()
    finally:
        watching.set()
        if watcher.ident is not None:
            watcher.join(5)
        deployment.stop()
    assert "NOLB" in statuses and "DOWN" not in statuses, statuses
    assert seen.registry.get_sample_value("hivemind_chat_client_reconnects_total",
                                          {"front": "openai"}) == 0
    print(f"behind haproxy: {failed} turns failed with the store, haproxy said {statuses}")
