"""Two genuine 5.x replicas with one client database (issue 27, part 6): config/
server-replica-shared-db.json puts hivemind-core's clients in Redis through the ecosystem's own
hivemind-redis-database (cached venv redis-db-hub-5), beside the conversation store on the same
Redis. A client registered once, with hivemind-core's own CLI on one replica, is served by the
other; its Noise pin, taken on one, holds on the other (a second static key for the same access
key is refused there, where separate databases gave the satellite a second identity); and a
revocation on one replica refuses the key on the other."""
import json
import os
import subprocess

import pytest
from hubs import HubProcess, argv, free_port
from replicas import CONFIG, clone_identity
from servers import RedisServer

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.errors import AccessKeyRejectedError, ClientKeyRefusedError

pytestmark = pytest.mark.hub


def shared_db_replica(redis: RedisServer) -> HubProcess:
    """A replica as config/server-replica-shared-db.json has it, on this test's Redis: the
    conversations in its db 0, the clients in db 1."""
    with open(os.path.join(CONFIG, "server-replica-shared-db.json")) as f:
        config = json.load(f)
    config["agent_protocol"]["hivemind-chat-agent-plugin"].update(
        engine="engines:ScriptEngine", conversation_store=redis.url,
        health=f"127.0.0.1:{free_port()}")
    config["database"]["hivemind-redis-db-plugin"]["port"] = redis.port
    return HubProcess(server_config=config, generation="5", venv="redis-db-hub-5")


@pytest.fixture
def replicas(tmp_path):
    redis = RedisServer(str(tmp_path)).start()
    first, second = shared_db_replica(redis), shared_db_replica(redis)
    try:
        yield redis, first.start(), second
    finally:
        first.cleanup()
        second.cleanup()
        redis.stop()


def ask(creds, port, key_dir, text: str) -> str:
    """`text` asked once in the conversation "kitchen" by a client of `creds` on the hub at
    `port` whose Noise keys are in `key_dir` (a device of its own), which then goes."""
    agent = HiveMindChatAgent(dict(creds.agent_config(timeout=20), port=port,
                                   noise_key_dir=str(key_dir)))
    try:
        return agent.get_response(text, session_id="kitchen")
    finally:
        agent.shutdown()


def test_a_client_registered_once_is_one_satellite_on_every_replica(replicas, tmp_path):
    redis, first, second = replicas
    creds = first.add_client(name="registered-once")          # on the first replica only
    mine, other_device = tmp_path / "keys", tmp_path / "other-keys"
    assert ask(creds, first.port, mine, "note the blue door") == "noted"
    clone_identity(first, second)          # the hub's own identity, as replicas share it
    second.start()
    # the same client row, so the same session namespace: the conversation continues
    assert ask(creds, second.port, mine, "notes") == "notes: the blue door"
    # a second Noise static key for this access key: the pin taken on the first replica holds
    with pytest.raises(ClientKeyRefusedError):
        ask(creds, second.port, other_device, "hello")
    # revoked with the second replica's CLI: refused by the first
    node_id = first.client_id(creds.key)
    done = subprocess.run([*argv(second.cli), "delete-client", node_id], env=second.env,
                          input="y\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    with pytest.raises(AccessKeyRejectedError):
        ask(creds, first.port, mine, "hello")


def test_with_a_database_per_replica_the_same_key_gets_a_second_identity(tmp_path):
    """Why the shared database: config/server-replica.json (a sqlite database per replica, the
    client registered on each) lets a second Noise static key in on the replica that has not
    seen the first, so one access key is two satellites."""
    from replicas import replica
    redis = RedisServer(str(tmp_path)).start()
    first = replica(redis.url, engine="engines:ScriptEngine").start()
    second = replica(redis.url, engine="engines:ScriptEngine")
    try:
        creds = first.add_client(name="registered-twice")
        assert ask(creds, first.port, tmp_path / "keys", "hello") == "hello there"
        clone_identity(first, second)
        second.start()
        second.add_client(name="registered-twice", key=creds.key, password=creds.password)
        assert ask(creds, second.port, tmp_path / "other-keys", "hello") == "hello there"
    finally:
        first.cleanup()
        second.cleanup()
        redis.stop()
