"""The MQTT transport: one hub connection through a broker, for `host: "mqtt://BROKER"`.

It meets the websocket transport's contract (`SocketOwner` reports, `emit`, `stop`,
`release`, `channel`), so `HubConnection` and everything above it (hivemind-bus-client's Noise
handshake in core/, turns, follow-ups, stops, asyncio) run unchanged. The topics and what the
hub does on them (hivemind-mqtt-protocol 0.2.5a2) are core/mqtt_link.py's; this module is paho
around `MqttGreeting`: connect, subscribe to the key's `out` and `status` topics, say HELLO
until the hub answers, publish frames to `in` (QoS 1: in order), and tell the owner when the
hub's session ended unannounced (`on_session_reset`).

paho-mqtt runs here without its own threads or reconnects: the connection's socket thread
calls `loop()` (as websocket-client's `run_forever` runs there), and a lost broker ends the
connection; the next turn opens a new one, with a new handshake (the hub's Noise state of the
old one is useless after it).

One session per access key: the hub's topics are the key's, and two satellites on a key break
each other, so this process holds at most one MQTT connection per broker, prefix and key
(`AccessKeyInUseError` for a second), and a connection says "offline" on the key's status
topic before it ends (the hub then drops its session at once, instead of swallowing the next
connection's HELLO), and "online" when it starts.
"""
import socket
import threading
from typing import Any, Dict, Optional, Tuple

import paho.mqtt.client as mqtt
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from hivemind_bus_client.util import serialize_message
from ovos_utils.log import LOG
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from hivemind_chat_agent import background, compat
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.transport import SocketOwner, hand_over
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.exchange import SecureChannel, frames_to_send
from hivemind_chat_agent.core.mqtt_link import (
    OFFLINE,
    ONLINE,
    QUIET,
    MqttGreeting,
    Step,
    Topics,
)
from hivemind_chat_agent.errors import (
    AccessKeyInUseError,
    BrokerRefusedError,
    ConfigurationError,
    ConnectionLostError,
    HubUnreachableError,
)

KEEPALIVE = 30        # seconds: MQTT pings to the broker (the hub has none of its own)
TICK = 0.05           # seconds: how often the loop looks at the clock (HELLO again, deadline)
GOODBYE_WITHIN = 1.0  # seconds a close waits for the broker to take our "offline"
KEY_FREED_WITHIN = 2.0   # seconds a new connection waits for this key's last one to end

# Our frames at QoS 0, as the hub sends its own: one TCP connection each way keeps them in
# order, and a lost broker ends the connection either way. At QoS 1 the hub's PUBACK (paho
# leaves Nagle on) held its answer for the broker's delayed ACK: about 40 ms a turn.
FRAME_QOS = 0
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)   # Linux only
_KeyId = Tuple[str, int, str, str]
_keys: Dict[_KeyId, int] = {}      # broker, port, prefix, key -> id() of the transport
_quiet_from: Dict[_KeyId, float] = {}   # when this key's status topic is quiet again
_keys_changed = threading.Condition()


def _claim(key_id: _KeyId, holder: int, where: str) -> None:
    with _keys_changed:
        if not _keys_changed.wait_for(lambda: _keys.get(key_id, holder) == holder,
                                      KEY_FREED_WITHIN):
            raise AccessKeyInUseError(
                f"this process already has an MQTT connection to the hub through {where} on "
                "this access key: a hivemind-mqtt-protocol hub keeps one session per key, and "
                "a second connection would break both. Give each agent (each satellite) an "
                "access key of its own (`hivemind-core add-client`)")
        _keys[key_id] = holder


def _free(key_id: _KeyId, holder: int) -> None:
    with _keys_changed:
        if _keys.get(key_id) == holder:
            del _keys[key_id]
            _keys_changed.notify_all()


class MqttTransport:
    """One hub session over MQTT. `run_forever` (the socket thread) connects and reads;
    `emit`, `stop`, `release`, `hub_has_read` are called from any thread."""

    def __init__(self, owner: SocketOwner, cfg: ClientConfig, useragent: str,
                 clock: Clock = background.SYSTEM_CLOCK):
        if not cfg.key or any(c in cfg.key for c in "/+#\0"):
            raise ConfigurationError("over MQTT the access key is a topic level: it cannot "
                                     "contain /, + or #")
        self._owner, self._config, self._clock = owner, cfg, clock
        self.topics = Topics(cfg.topic_prefix, cfg.key)
        self._key_id: _KeyId = (cfg.host, cfg.port, cfg.topic_prefix, cfg.key)
        self.where = f"{cfg.url_host}:{cfg.port} (topics {cfg.topic_prefix}/<key>/...)"
        self._greeting = MqttGreeting(self.where, clock.now(), _hello_deadline(cfg))
        self.channel: Optional[SecureChannel] = None   # set by the owner at the handshake
        self._send_lock = threading.Lock()   # Noise nonces: frames go out in sealed order
        self._stopped = threading.Event()
        self._goodbye: Optional[Any] = None   # the "offline" publish under way
        self._goodbye_by = 0.0
        self._client = self._paho(useragent)

    def _paho(self, useragent: str) -> mqtt.Client:
        cfg = self._config
        client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2,
                             client_id=useragent, clean_session=True)
        client.connect_timeout = cfg.connect_timeout
        if cfg.broker_username:
            client.username_pw_set(cfg.broker_username, cfg.broker_password)
        if cfg.secure:
            client.tls_set(ca_certs=cfg.ca_file)   # None: the system CAs; hostname checked
        client.will_set(self.topics.status, OFFLINE, qos=1, retain=True)
        client.on_connect, client.on_subscribe = self._on_connect, self._on_subscribe
        client.on_message = self._on_message
        return client

    # ---- the socket thread ----
    def run_forever(self) -> None:
        try:
            _claim(self._key_id, id(self), self.where)
        except AccessKeyInUseError as e:
            self._owner.on_socket_error(e)
            return
        try:
            self._run()
        finally:
            _free(self._key_id, id(self))

    def _run(self) -> None:
        client, cfg = self._client, self._config
        compat.paho_writes_on_loop_thread(client, threading.current_thread())
        try:
            client.connect(cfg.host, cfg.port, keepalive=KEEPALIVE)
        except Exception as e:   # refused, unreachable, timed out, TLS
            self._greeting.ended()
            self._owner.on_socket_error(_unreachable(e, self.where, cfg.connect_timeout))
            return
        self._tcp_option(socket.TCP_NODELAY)   # paho leaves Nagle on: frames would wait
        while True:
            rc = client.loop(timeout=TICK)
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                break
            if not self._stopped.is_set():
                self._apply(self._greeting.tick(self._clock.now()))
            elif self._goodbye is None or self._goodbye.is_published() or \
                    self._clock.now() >= self._goodbye_by:
                client.disconnect()
                return
        if not self._stopped.is_set():   # the broker went away under us
            self._greeting.ended()
            self.channel = None
            self._owner.on_socket_close(None, f"the MQTT broker {self.where} closed the "
                                              f"connection ({mqtt.error_string(rc)})")

    def _on_connect(self, client, _userdata, _flags, reason_code, _properties=None) -> None:
        if reason_code.is_failure:
            self._greeting.ended()
            self._stopped.set()
            self._owner.on_socket_error(BrokerRefusedError(
                f"the MQTT broker {self.where} refused the connection ({reason_code}); check "
                "broker_username and broker_password, and the broker's ACL for this client"))
            return
        client.subscribe([(self.topics.outbound, 1), (self.topics.status, 1)])

    def _on_subscribe(self, client, _userdata, _mid, reason_codes, _properties=None) -> None:
        if any(rc.is_failure for rc in reason_codes):
            self._greeting.ended()
            self._stopped.set()
            self._owner.on_socket_error(BrokerRefusedError(
                f"the MQTT broker {self.where} refused our subscription to this key's topics; "
                "check its ACL: a satellite reads <prefix>/<key>/out and /status and writes "
                "<prefix>/<key>/in and /status"))
            return
        client.publish(self.topics.status, ONLINE, qos=1, retain=True)
        self._apply(self._greeting.subscribed(self._clock.now(),
                                              _quiet_from.get(self._key_id, 0.0)))

    def _tcp_option(self, option: Optional[int]) -> None:
        """Set a TCP option on the broker socket (best effort: TLS wraps it, Linux only)."""
        sock: Any = self._client.socket()
        if sock is not None and option is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, 1)
            except (OSError, AttributeError):
                pass

    def _on_message(self, _client, _userdata, msg) -> None:
        # acknowledge at once: a broker without set_tcp_nodelay holds its next packet (the
        # hub's `handled` after a `speak`) for our delayed ACK, as tornado does (transport.py)
        self._tcp_option(_QUICKACK)
        channel = self.channel is not None
        if msg.topic == self.topics.status:
            now = self._clock.now()
            if not msg.retain and msg.payload.strip() == OFFLINE.encode():
                _quiet_from[self._key_id] = now + QUIET     # for this key's next connection
            step = self._greeting.status(msg.payload, bool(msg.retain), channel, now)
        elif msg.topic == self.topics.outbound:
            step = self._greeting.frame(msg.payload, channel)
        else:
            return
        self._apply(step)

    def _apply(self, step: Step) -> None:
        if step.open:
            self._owner.on_socket_open()
        if step.hello:
            hello = HiveMessage(HiveMessageType.HELLO,
                                {"site_id": self._config.site_id or "unknown"})
            self._publish(serialize_message(hello).encode("utf-8"), raising=False)
        if step.deliver is not None:
            hand_over(self._owner, step.deliver, self.channel, self._config.max_frame_bytes)
        if step.fail is not None:
            self._owner.on_socket_error(step.fail)
        if step.reset:
            self.channel = None
            LOG.info(f"MQTT: {step.reset}; a new session starts with the next connection")
            self._owner.on_session_reset(step.reset)

    # ---- any thread ----
    def emit(self, message: HiveMessage) -> None:
        """Send one message to the hub's `in` topic: its frames (core.exchange.frames_to_send:
        the handshake in the clear, the rest sealed by the channel read once here) sealed and
        published under one lock, so they are queued in the sealed order, and the socket
        thread writes that queue in order (compat.paho_writes_on_loop_thread); any failure is
        a ConnectionLostError."""
        text = serialize_message(message)
        with self._send_lock:
            for data, _binary in frames_to_send(message.msg_type, text, self.channel):
                self._publish(data if isinstance(data, bytes) else data.encode("utf-8"))

    def _publish(self, payload: bytes, raising: bool = True) -> None:
        info = self._client.publish(self.topics.inbound, payload, qos=FRAME_QOS)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS and raising:
            raise ConnectionLostError(
                f"could not publish to the MQTT broker {self.where} "
                f"({mqtt.error_string(info.rc)}); the next turn reconnects")

    def hub_has_read(self, timeout: float) -> bool:
        """MQTT has no ping through to the hub: nothing to wait for (asked on 4.x hubs only,
        which have no MQTT)."""
        return False

    def stop(self, wait_for_hub: float = 0.0) -> None:
        """End the session: "offline" on the key's status topic (the hub drops its session
        of this key at once), then the socket thread disconnects, once the broker took it
        (at most GOODBYE_WITHIN)."""
        if self._stopped.is_set():
            return
        self._goodbye_by = self._clock.now() + GOODBYE_WITHIN
        self._greeting.ended()     # before our "offline" comes back to us
        if self._client.is_connected():
            self._goodbye = self._client.publish(self.topics.status, OFFLINE, qos=1,
                                                 retain=True)
        self._stopped.set()

    def release(self) -> None:
        """Close the socket now if the thread did not (it disconnects as it ends)."""
        try:
            sock = self._client.socket()
            if sock is not None:
                sock.close()
        except Exception:
            pass


def _hello_deadline(cfg: ClientConfig) -> float:
    """Our HubSilentError comes a little before HubConnection's own connect timeout."""
    return max(cfg.connect_timeout - 0.25, cfg.connect_timeout / 2)


def _unreachable(error: Exception, where: str, timeout: float) -> HubUnreachableError:
    if isinstance(error, ConnectionRefusedError):
        return HubUnreachableError(f"connection refused by the MQTT broker {where}; check "
                                   "host and port and that the broker is running")
    if isinstance(error, (TimeoutError, OSError)) and "timed out" in str(error):
        return HubUnreachableError(f"no MQTT broker answered at {where} within {timeout:g} s; "
                                   "check host and port")
    return HubUnreachableError(f"could not connect to the MQTT broker {where} "
                               f"({type(error).__name__}); check host, port and TLS settings")
