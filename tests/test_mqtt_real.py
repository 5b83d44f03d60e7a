"""Our client over MQTT, against the genuine article: a hivemind-core 5.3.10a1 hub with
hivemind-mqtt-protocol 0.2.5a2 (tests/hub_venvs.py's mqtt-hub-5) and this checkout's hub
plugin, through Debian's mosquitto on 127.0.0.1. Answers, history, follow-ups, a stop, two
access keys kept apart, the hub's silence on an unknown key, a wrong password, one session per
key, and the hub's session ending under the client (a broker restart, the hub's idle eviction):
the next turn is answered, and nothing is lost or run twice."""
import json
import os
import secrets
import time

import pytest

pytest.importorskip("paho.mqtt", reason="needs the [mqtt] extra (.ci/run installs it with "
                                        "[test]): pip install -c constraints.txt -e '.[mqtt]'")

from hubs import hub_generations  # noqa: E402
from mqtt_hub import PREFIX, MqttHub  # noqa: E402
from servers import MosquittoServer  # noqa: E402
from waiting import UNIT, hold_still, wait_until  # noqa: E402

from hivemind_chat_agent import (  # noqa: E402
    AccessKeyInUseError,
    BrokerRefusedError,
    HubSilentError,
    TurnStatus,
    WrongPasswordError,
)

pytestmark = pytest.mark.hub
if "5" not in hub_generations():     # HIVEMIND_CHAT_GENERATIONS=4.0: MQTT is a 5.x transport
    pytest.skip("hivemind-mqtt-protocol needs a 5.x hub", allow_module_level=True)
EVICT_AFTER = 1      # the hub's idle_timeout (s); its sweep runs every 30 s at the most often


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    server = MosquittoServer(str(tmp_path_factory.mktemp("mosquitto"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mqtt_hub(broker):
    hub = MqttHub(broker).start()
    yield hub
    hub.cleanup()


@pytest.fixture
def keys(tmp_path):
    return str(tmp_path / "noise-keys")


def asked(agent, session_id="probe"):
    """Every utterance the hub's engine ran, in order (tests/engines.py's "asked")."""
    return json.loads(agent.get_response("asked", session_id=session_id))


def test_answers_history_and_sessions_over_mqtt(mqtt_hub, keys, make_agent):
    agent = make_agent(mqtt_hub.client(noise_key_dir=keys))
    assert agent.get_response("hello", session_id="m-a") == "hello there"
    agent.get_response("remember the blue door", session_id="m-a")
    assert "blue door" in agent.get_response("recall", session_id="m-a")
    assert agent.get_response("whoami", session_id="m-b").endswith("-m-b")   # the plugin's
    # engine sees the session under the satellite's namespace
    conn = agent.pool.peek("m-a")
    assert conn.generation.startswith("5.x") and conn.config.transport == "mqtt"
    assert len(agent.pool) == 1
    history = json.loads(agent.get_response("history", session_id="m-a"))
    assert [text for _, text in history][-2:] == ["recall", "you said the blue door"]


def test_many_sessions_at_once_share_the_keys_one_connection_with_no_crosstalk(
        mqtt_hub, keys, make_agent):
    import threading
    agent = make_agent(mqtt_hub.client(noise_key_dir=keys))
    agent.get_response("hello", session_id="warm")
    answers, errors = {}, []

    def turn(k):
        try:
            answers[k] = agent.get_response(f"echo many {k}", session_id=f"many-{k}")
        except Exception as e:   # noqa: BLE001 - collected and asserted below
            errors.append(e)
    threads = [threading.Thread(target=turn, args=(k,)) for k in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert answers == {k: f"you said echo many {k}" for k in range(24)}
    assert len(agent.pool) == 1


def test_a_stop_ends_the_answer_and_the_next_turn_runs(mqtt_hub, keys, make_agent):
    agent = make_agent(mqtt_hub.client(noise_key_dir=keys))
    turn = agent.begin(user("talk 100 0.1"), session_id="m-stop")
    sentences = iter(turn)
    assert [next(sentences), next(sentences)] == ["talk sentence 1", "talk sentence 2"]
    turn.terminate()
    assert turn.status is TurnStatus.CANCELLED and turn.is_done()
    assert wait_until(lambda: turn.get_snapshot()["hub_stopped_at"]), turn.get_snapshot()
    stops = json.loads(agent.get_response("stops", session_id="probe"))
    assert "stop_session" in {kind for kind, _ in stops}, stops
    assert agent.get_response("count 2", session_id="m-stop") == "sentence 1\nsentence 2"


def test_the_asyncio_api_over_mqtt(mqtt_hub, keys, make_agent):
    import asyncio
    agent = make_agent(mqtt_hub.client(noise_key_dir=keys))

    async def both():
        return await asyncio.gather(agent.acontinue_chat(user("count 2"), session_id="m-x"),
                                    agent.acontinue_chat(user("hello"), session_id="m-y"))
    assert [m.content for m in asyncio.run(both())] == ["sentence 1\nsentence 2",
                                                        "hello there"]


def test_two_access_keys_are_kept_apart(mqtt_hub, tmp_path, make_agent):
    a = make_agent(mqtt_hub.client(noise_key_dir=str(tmp_path / "a")))
    b = make_agent(mqtt_hub.client(noise_key_dir=str(tmp_path / "b")))
    a.get_response("remember the secret of a", session_id="shared-name")
    assert b.get_response("recall", session_id="shared-name") == "I remember nothing"
    assert a.get_response("recall", session_id="shared-name") == "you said the secret of a"
    assert b.get_response("hello", session_id="shared-name") == "hello there"


def test_one_session_per_access_key_is_explicit(mqtt_hub, keys, make_agent):
    config = mqtt_hub.client(noise_key_dir=keys)
    first = make_agent(config)
    assert first.get_response("hello", session_id="one") == "hello there"
    second = make_agent(config)
    with pytest.raises(AccessKeyInUseError, match="one session per key"):
        second.get_response("hello", session_id="two")
    assert first.get_response("count 1", session_id="one") == "sentence 1"   # unharmed


def test_an_unknown_key_is_silence_that_ends_in_an_error_saying_what_to_check(
        mqtt_hub, keys, make_agent):
    config = {**mqtt_hub.client(noise_key_dir=keys), "key": secrets.token_hex(16),
              "connect_timeout": 3}
    started = time.monotonic()
    with pytest.raises(HubSilentError, match="registered on the hub") as raised:
        make_agent(config).get_response("hello")
    assert time.monotonic() - started < 3 + 4 * UNIT
    assert config["key"] not in str(raised.value)


def test_a_wrong_password_shows_in_the_handshake(mqtt_hub, keys, make_agent):
    config = {**mqtt_hub.client(noise_key_dir=keys), "password": "not-the-password"}
    with pytest.raises(WrongPasswordError):
        make_agent(config).get_response("hello")


def test_a_broker_refusing_our_credentials_is_a_typed_error(tmp_path, keys, make_agent):
    broker = MosquittoServer(str(tmp_path / "locked"), users={"hub": "s3cret"}).start()
    try:
        config = {"host": f"mqtt://127.0.0.1:{broker.port}", "key": "k", "password": "p",
                  "broker_username": "hub", "broker_password": "wrong",
                  "noise_key_dir": keys, "connect_timeout": 5}
        with pytest.raises(BrokerRefusedError, match="broker_username"):
            make_agent(config).get_response("hello")
    finally:
        broker.stop()


def test_mqtts_verifies_the_brokers_certificate_against_ca_file(tmp_path, keys, make_agent):
    from test_tls import issue

    from hivemind_chat_agent import HubUnreachableError
    ca = issue(str(tmp_path / "pki"), "ca", ca=True)
    cert = issue(str(tmp_path / "pki"), "broker", ips=["127.0.0.1"], issuer=ca)
    broker = MosquittoServer(str(tmp_path / "tls"),
                             tls=(ca.cert_path, cert.cert_path, cert.key_path)).start()
    hub = MqttHub(broker)         # the hub on the plain listener, the client on TLS
    try:
        hub.start()
        config = {**hub.client(noise_key_dir=keys),
                  "host": f"mqtts://127.0.0.1:{broker.tls_port}"}
        with pytest.raises(HubUnreachableError, match="TLS"):
            make_agent({**config, "connect_timeout": 5}).get_response("hello")
        agent = make_agent({**config, "ca_file": ca.cert_path})
        assert agent.get_response("hello", session_id="tls") == "hello there"
        assert agent.pool.peek("tls").config.secure
    finally:
        hub.cleanup()
        broker.stop()


def test_a_broker_restart_between_turns_loses_nothing_and_runs_nothing_twice(
        mqtt_hub, keys, make_agent):
    agent = make_agent(mqtt_hub.client(noise_key_dir=keys))
    assert agent.get_response("echo before the restart", session_id="m-r") == \
        "you said echo before the restart"
    mqtt_hub.broker.stop()
    mqtt_hub.broker.start()
    try:
        assert agent.get_response("echo after the restart", session_id="m-r") == \
            "you said echo after the restart"
    except Exception:      # what the hub's MQTT side did, for the failure's report
        print("\n".join(line[:300] for line in mqtt_hub.hub.logs().splitlines()[-60:]
                        if "MQTT" in line or "eject" in line))
        raise
    ran = asked(agent)
    assert ran.count("echo before the restart") == 1 and \
        ran.count("echo after the restart") == 1, ran


def test_the_hubs_idle_eviction_ends_the_session_and_the_next_turn_runs_once(
        broker, keys, make_agent, warnings_of_ours):
    """hivemind-mqtt-protocol drops a key's session after `idle_timeout` of silence and says
    "offline" on the key's status topic: the connection ends there, the next turn makes a new
    handshake and runs once."""
    hub = MqttHub(broker, idle_timeout=EVICT_AFTER).start()
    try:
        agent = make_agent(hub.client(noise_key_dir=keys))
        assert agent.get_response("echo first", session_id="m-e") == "you said echo first"
        first = agent.pool.peek("m-e")
        assert wait_until(lambda: not first.alive, 45), "the hub never evicted the session"
        assert "Idle timeout for peer" in hub.hub.logs()
        assert agent.get_response("echo after the eviction", session_id="m-e") == \
            "you said echo after the eviction"
        assert agent.pool.peek("m-e") is not first
        ran = asked(agent)
        assert ran == ["echo first", "echo after the eviction"], ran
        assert not warnings_of_ours, warnings_of_ours
    finally:
        hub.cleanup()


def test_a_turn_sent_into_a_session_the_hub_no_longer_has_is_sent_again_and_runs_once(
        broker, keys, make_agent, warnings_of_ours):
    """A hub restarted (killed) between turns has no session for the key and says nothing:
    the next turn's frame opens a new session there, which drops it unread and says HELLO.
    That turn never ran: it is sent again, on a new handshake, and runs once."""
    hub = MqttHub(broker).start()
    try:
        agent = make_agent(hub.client(noise_key_dir=keys))
        assert agent.get_response("echo first", session_id="m-k") == "you said echo first"
        first = agent.pool.peek("m-k")
        hub.hub.kill()
        hub.start(connected=2)
        hold_still()                  # its subscriptions granted
        assert first.alive            # nothing told the client
        try:
            assert agent.get_response("echo into a session the hub lost",
                                      session_id="m-k") == \
                "you said echo into a session the hub lost"
        except Exception:      # what the hub's MQTT side did, for the failure's report
            print("\n".join(line[:300] for line in hub.hub.logs().splitlines()[-80:]
                            if "MQTT" in line or "eject" in line or "isconnect" in line))
            raise
        assert agent.pool.peek("m-k") is not first and not first.alive
        ran = asked(agent)
        assert ran == ["echo into a session the hub lost"], ran   # a new hub process
        assert not warnings_of_ours, warnings_of_ours
    finally:
        hub.cleanup()


def test_the_stock_ovos_agent_plugin_answers_our_mqtt_client(broker, keys, make_agent):
    """The same 5.x hub with the stock hivemind-ovos-agent-plugin 0.5.3a1 in front of a genuine
    ovos-messagebus and an answering service (tests/stock_hub.py's, from the hub-4.0 venv)."""
    from stock_hub import STOCK_PLUGIN, StockOVOSHub
    stock = StockOVOSHub()
    hub = MqttHub(broker, agent_protocol={"module": STOCK_PLUGIN, STOCK_PLUGIN: {
        "host": "127.0.0.1", "port": stock.bus_port}})
    conf = os.path.join("config", "mycroft", "mycroft.conf")   # the bus's port
    os.makedirs(os.path.dirname(os.path.join(hub.hub.home, conf)), exist_ok=True)
    with open(os.path.join(stock.home, conf)) as f:
        mycroft = {**json.load(f), "log_level": "INFO"}   # the hub logs its MQTT connect
    with open(os.path.join(hub.hub.home, conf), "w") as f:
        json.dump(mycroft, f)
    stock.hub.cleanup()                       # the 4.0 hub it made: this 5.x one instead
    stock.hub, stock.home = hub.hub, hub.hub.home
    try:
        stock.start()                         # the bus, the answering service, the hub
        hub.connected()
        agent = make_agent(hub.client(noise_key_dir=keys))
        assert agent.get_response("hello", session_id="stock-a") == "you said hello"
        assert agent.get_response("again", session_id="stock-b") == "you said again"
    finally:
        stock.cleanup()


def test_a_skills_follow_up_question_over_mqtt_through_the_ovos_mode(broker, keys, make_agent):
    """A genuine ovos-core 3.7 with real skills behind the 5.x hub in OVOS mode (tests/ovos_hub.py,
    the hub from the mqtt-hub-5 venv), reached only through the broker: the alerts skill asks
    for the time with get_response, the turn ends ASKED (a voice loop reopens its microphone),
    and the next utterance of that session is the skill's answer, not a new turn."""
    from ovos_hub import OVOSHub
    ovos = OVOSHub("5", "ovos-mode", hub_venv="mqtt-hub-5", network={"hivemind-mqtt-plugin": {
        "broker_host": "127.0.0.1", "broker_port": broker.port, "topic_prefix": PREFIX}})
    try:
        ovos.start()
        assert wait_until(lambda: "[MQTT] Connected to broker"
                          in ovos.log_tail("hivemind", 10 ** 7), 30), ovos.log_tail("hivemind")
        creds = ovos.add_client()
        # alerts loads its parsers at its first question: seconds on a loaded machine
        agent = make_agent({"host": f"mqtt://127.0.0.1:{broker.port}", "key": creds.key,
                            "password": creds.password, "topic_prefix": PREFIX, "timeout": 60},
                           noise_key_dir=keys)
        question = agent.begin(user("set an alarm"), session_id="mqtt-alarm")
        assert "time" in question.full_response(timeout=60).lower()
        assert question.status is TurnStatus.ASKED and question.expect_response
        # the alarm would ring long after the hub is gone
        answer = agent.begin(user("in five hours"), session_id="mqtt-alarm")
        said = answer.full_response(timeout=60)
        assert "alarm is set for" in said.lower() and "five hours" in said, said
        assert answer.status is TurnStatus.ANSWERED and not answer.expect_response
    finally:
        ovos.cleanup()


def test_the_command_line_takes_the_same_host(mqtt_hub, tmp_path):
    import subprocess
    import sys
    config = mqtt_hub.client()
    cli = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")
    proc = subprocess.run(
        [cli, "--host", config["host"], "--topic-prefix", PREFIX, "--key", config["key"],
         "--password-file", str(_write(tmp_path / "pw", config["password"])), "--no-store",
         "hello"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"),
             "XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert proc.returncode == 0 and proc.stdout.strip() == "hello there", \
        (proc.stdout, proc.stderr[-2000:])


def test_a_front_takes_the_same_host(mqtt_hub, tmp_path):
    """`hivemind-chat openai` (every front shares the CLI's hub options) over MQTT, asked by
    the `openai` client."""
    import openai
    from fronts import front_command, reap
    from hubs import free_port, wait_listening
    config, port = mqtt_hub.client(), free_port()
    proc = front_command(
        "openai", "--uri", f"http://127.0.0.1:{port}", "--host", config["host"],
        "--topic-prefix", PREFIX, "--key", config["key"], "--password-file",
        str(_write(tmp_path / "pw", config["password"])), "--no-store",
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"),
             "XDG_CONFIG_HOME": str(tmp_path / "config")})
    try:
        wait_listening(port, 30, proc=proc, what="hivemind-chat openai")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-",
                               max_retries=0)
        reply = client.chat.completions.create(
            model="hub", messages=[{"role": "user", "content": "hello"}])
        assert reply.choices[0].message.content == "hello there"
    finally:
        proc.terminate()
        reap(proc)


def _write(path, text):
    path.write_text(text + "\n")
    return path


def user(text):
    from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole
    return [AgentMessage(MessageRole.USER, text)]
