"""Each patch in compat.py needs attributes of another library; these fail when one of the
pinned versions (constraints.txt, and the 4.0 hub's venv) no longer has them."""
import json
import subprocess

import pytest

from hivemind_chat_agent import compat


def test_the_codecs_exist_where_the_leak_free_ones_go():
    import importlib
    for user in compat.CODEC_USERS:
        module = importlib.import_module(user)
        assert all(hasattr(module, name) for name in compat.PURE_CODECS), user
    for name, pure in compat.PURE_CODECS.items():
        assert hasattr(importlib.import_module(pure), name)
    compat.use_leak_free_codecs()
    from hivemind_bus_client import encryption
    assert encryption.B91.__module__ == compat.PURE_CODECS["B91"]


def test_websocket_clients_frame_buffer_can_be_bounded():
    from websocket._abnf import continuous_frame, frame_buffer

    class Sock:
        def __init__(self):
            self.frame_buffer = frame_buffer(lambda n: b"", True)
            self.cont_frame = continuous_frame(True, False)
    sock = Sock()
    assert compat.bound_frame_length(sock, 10, lambda size: ValueError(size))
    sock.frame_buffer.header = (1, 0, 0, 0, 1, 0, 126)     # a header announcing 126+ bytes
    sock.frame_buffer.recv_strict = lambda n: (300).to_bytes(2, "big")
    with pytest.raises(ValueError, match="300"):
        sock.frame_buffer.recv_length()


def test_a_session_is_registered_under_its_id_under_the_registrys_lock():
    """register_session takes ovos-bus-client's registry lock (1.x `__lock`, 2.x `_lock`): it
    raises here when a pinned version has neither."""
    from ovos_bus_client.session import Session, SessionManager
    sess = Session("compat-registered")
    try:
        assert compat.register_session(sess) is sess
        assert SessionManager.sessions["compat-registered"] is sess
    finally:
        SessionManager.sessions.pop("compat-registered", None)


@pytest.mark.hub
def test_a_4_0_hubs_connection_still_decodes_where_the_watch_wraps_it():
    """Run in the hivemind-core 4.0.0 venv: the wrapped `decode` and the tornado handler that
    hivemind-websocket-protocol's `send_msg` closes over."""
    import hub_venvs
    venv = hub_venvs.ensure_venv("hub-4.0")
    probe = (
        "import json\n"
        "from hivemind_chat_agent import compat\n"
        "from hivemind_core.protocol import HiveMindClientConnection as C\n"
        "marks = []\n"
        "wrapped = compat.watch_v4_decoding(lambda c, p: marks.append(p))\n"
        "import hivemind_websocket_protocol as w\n"
        "print(json.dumps({'wrapped': wrapped, 'key': hasattr(C, 'crypto_key'),\n"
        "                  'decode': getattr(C.decode, '_hivemind_chat_watch', False),\n"
        "                  'handler': hasattr(w, 'HiveMindTornadoWebSocket')}))\n")
    out = subprocess.run([f"{venv}/bin/python", "-c", probe], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": hub_venvs.package_path()})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "wrapped": True, "key": True, "decode": True, "handler": True}


@pytest.mark.hub
def test_a_4_0_hubs_log_names_loggers_as_before_without_reading_the_stack(tmp_path):
    """Run in the hivemind-core 4.0.0 venv (ovos-utils 0.8.5): LOG's logger for a call site in
    a module is named as ovos-utils named it (module:function:line), and no longer through
    inspect.stack() (counted: the patch must not call it)."""
    import hub_venvs
    venv = hub_venvs.ensure_venv("hub-4.0")
    (tmp_path / "log_site.py").write_text(
        "from ovos_utils.log import LOG\n"
        "def site():\n"
        "    return LOG._get_real_logger()\n"
        "def caller():\n"
        "    return site()\n")
    probe = (
        "import inspect, json\n"
        "from log_site import caller\n"
        "before = caller().name\n"
        "from hivemind_chat_agent import compat\n"
        "patched = compat.name_loggers_cheaply()\n"
        "calls = []\n"
        "real = inspect.stack\n"
        "inspect.stack = lambda *a, **k: calls.append(1) or real(*a, **k)\n"
        "after = caller().name\n"
        "print(json.dumps({'patched': patched, 'before': before, 'after': after,\n"
        "                  'again': compat.name_loggers_cheaply(), 'stack_calls': len(calls)}))\n")
    out = subprocess.run([f"{venv}/bin/python", "-c", probe], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": f"{hub_venvs.package_path()}:{tmp_path}"})
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"patched": True, "before": "OVOS - log_site:caller:5",
                      "after": "OVOS - log_site:caller:5", "again": True, "stack_calls": 0}


def test_a_current_ovos_utils_log_is_left_alone():
    """ovos-utils 0.15 (this venv) reads only the caller's frame itself: nothing patched."""
    from ovos_utils.log import LOG

    from hivemind_chat_agent import compat
    real = LOG._get_real_logger
    assert compat.name_loggers_cheaply() is False
    assert LOG._get_real_logger == real


def test_paho_still_has_the_thread_attribute_its_loop_thread_is_named_by():
    import threading

    import pytest
    mqtt = pytest.importorskip("paho.mqtt.client")
    from paho.mqtt.enums import CallbackAPIVersion
    client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="c")
    assert compat.paho_writes_on_loop_thread(client, threading.current_thread())
    assert client._thread is threading.current_thread()


def test_an_mqtt_hubs_paho_client_writes_only_on_its_loop_thread(monkeypatch):
    """hivemind-mqtt-protocol's connection closes over its paho client (run by loop_forever,
    so `_thread` is None): named at the connection's first message on the MQTT thread, a
    publish from the plugin's reply thread only queues its packet (the loop writes it),
    where before it wrote at once, racing the loop thread's own writes."""
    import threading

    mqtt = pytest.importorskip("paho.mqtt.client")
    from paho.mqtt.enums import CallbackAPIVersion
    client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="hub")
    writers = []
    monkeypatch.setattr(client, "loop_write", lambda: writers.append(threading.get_ident()))

    def send_msg(payload, is_bin=False):
        client._packet_queue(0x30, bytearray(b"frame"), 0, 0)    # what publish queues

    connection = type("Connection", (), {"send_msg": staticmethod(send_msg)})()
    reply_thread = threading.Thread(target=connection.send_msg, args=(b"before",))
    reply_thread.start()
    reply_thread.join()
    assert writers, "paho wrote from the reply thread (the race this patch removes)"
    writers.clear()
    mqtt_thread = threading.Thread(target=lambda: writers.append(
        ("named", compat.mqtt_writes_on_its_thread(connection))))
    mqtt_thread.start()
    mqtt_thread.join()
    assert writers == [("named", True)] and client._thread is mqtt_thread
    writers.clear()
    reply_thread = threading.Thread(target=connection.send_msg, args=(b"after",))
    reply_thread.start()
    reply_thread.join()
    assert writers == []                  # queued for the loop thread, not written here
    # and the queued packet wakes the loop's select() (loop_forever makes no such pair: the
    # reply waited out select's 1 s timeout)
    assert client._sockpairR.recv(16), "the publish did not wake the loop"
    client._reset_sockets(sockpair_only=True)               # what a reconnect does
    again = threading.Thread(target=lambda: writers.append(
        compat.mqtt_writes_on_its_thread(connection)))
    again.start()
    again.join()
    assert writers == [False] and client._sockpairW is None   # another thread: left alone
    client._thread = threading.current_thread()
    assert compat.mqtt_writes_on_its_thread(connection) and client._sockpairW is not None
    client._reset_sockets(sockpair_only=True)
    assert compat.mqtt_writes_on_its_thread(type("Ws", (), {"send_msg": print})()) is False


def clients_last_seen(hub, key: str) -> float:
    """`last_seen` of the client with access key `key` in a 4.0 hub's JSON client database."""
    import os

    from hubs import hub_environment
    path = os.path.join(hub_environment(hub.home)["XDG_DATA_HOME"], "hivemind-core",
                        "clients.json")
    with open(path) as f:
        clients = json.load(f)
    rows = clients.values() if isinstance(clients, dict) else clients
    return float(next(c["last_seen"] for c in rows if c.get("api_key") == key))


@pytest.mark.hub
def test_a_4_0_hub_writes_a_clients_last_seen_once_a_minute_not_after_every_message(
        make_agent):
    """hivemind-core 4.0.0 with our plugin: the client database is written at a client's first
    message (its handshake), and not again by the turns that follow within the minute (4.0
    alone rewrote the whole file after each message, on the IO loop). A 5.x hub is left as it
    is: it has the same debounce."""
    from hubs import HubProcess, plugin_config
    hub = HubProcess(plugin_config(), generation="4.0").start()
    try:
        credentials = hub.add_client(name="seen")
        agent = make_agent(credentials.agent_config(timeout=30))
        assert agent.get_response("hello", session_id="seen") == "hello there"
        first = clients_last_seen(hub, credentials.key)
        for i in range(5):
            assert f"echo {i}" in agent.get_response(f"echo {i}", session_id="seen")
        assert first > 0 and clients_last_seen(hub, credentials.key) == first
    finally:
        hub.cleanup()
