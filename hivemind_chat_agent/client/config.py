"""The client agent's configuration: defaults, the identity fallback and validation, in one
place."""
import hashlib
import os
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

from hivemind_chat_agent.client.noise_keys import default_key_dir
from hivemind_chat_agent.client.tls_pins import check_ca_file
from hivemind_chat_agent.core.refusals import UTTERANCE_TOPICS
from hivemind_chat_agent.errors import ConfigurationError

DEFAULT_PORT = 5678
MQTT_PORTS = {False: 1883, True: 8883}   # mqtt://, mqtts:// (the IANA ports)
MQTT_SCHEMES = ("mqtt://", "mqtts://")


@dataclass(frozen=True)
class ClientConfig:
    """Everything a connection needs; built once per agent so a turn never re-reads files."""
    host: str
    port: int
    key: str = field(repr=False)
    password: str = field(repr=False)
    secure: bool = False            # wss:// instead of ws://
    self_signed: bool = False       # wss://: pin the hub's certificate at first use, per address
    ca_file: Optional[str] = None   # wss://: verify against this PEM file, not the system CAs
    site_id: Optional[str] = None
    useragent: str = "hivemind-chat-agent"
    timeout: float = 30.0           # rolling, per turn
    connect_timeout: float = 10.0
    max_connections: int = 32       # one per active session_id on a 4.x hub
    shared_connections: int = 4     # all session_ids, on a hub that reads each message's Session
    share_connections: bool = True  # False: a connection per session_id on every hub
    spare_connections: int = 0      # handshaken connections kept for new sessions on a 4.x hub
    idle_timeout: float = 300.0     # an idle connection is closed after this long
    default_session_id: str = ""    # what the caller's "default" session_id becomes
    session_store: Optional[str] = None   # directory keeping sessions across processes
    session_store_max: int = 1000   # sessions kept per client in the store
    session_store_ttl: float = 30 * 86400   # a stored session older than this starts afresh
    plays_audio: bool = False       # True: the caller reports the end of playback itself
    churn_guard: float = 1.0        # 0: off; else connects/closes wait for turns in flight
    max_frame_bytes: int = 1 << 20  # a larger frame from the hub closes the connection unread
    max_sessions: int = 10_000      # conversations kept in memory (least recently used first)
    session_idle_ttl: float = 3600.0   # a conversation idle this long leaves memory
    utterance_topic: Optional[str] = None   # None: whichever of the two the hub allows
    noise_key_dir: str = ""         # this client's Noise static keys and the hubs' pinned keys
    # every hub `host` names, in order, as (host, secure, port); host, secure and port above
    # are the first. A new connection tries the one that answered last, then the others.
    hubs: Tuple[Tuple[str, bool, int], ...] = ()
    # "mqtt": host names an MQTT broker (mqtt:// or mqtts://), the hub a hivemind-mqtt-protocol
    # hub on it (client/mqtt_transport.py); "websocket" otherwise
    transport: str = "websocket"
    topic_prefix: str = "hivemind"              # MQTT: the hub's topic_prefix
    broker_username: Optional[str] = None       # MQTT: the broker's own credentials
    broker_password: Optional[str] = field(default=None, repr=False)

    def with_hub(self, index: int) -> "ClientConfig":
        """This config for the `index`-th hub of `hubs`."""
        if not self.hubs:
            return self
        host, secure, port = self.hubs[index]
        return replace(self, host=host, secure=secure, port=port)

    @property
    def url_host(self) -> str:
        if self.transport == "mqtt":
            return f"{'mqtts' if self.secure else 'mqtt'}://{self.host}"
        return f"{'wss' if self.secure else 'ws'}://{self.host}"

    @classmethod
    def from_dict(cls, config: Optional[Dict[str, Any]] = None, identity=None) -> "ClientConfig":
        """Merge the user's config over the HiveMind client identity
        (`hivemind-client set-identity`).

        `identity` is only read when the config lacks host, key or password, so an explicit config
        never touches ~/.config/hivemind.
        """
        config = _with_identity(dict(config or {}), identity)
        missing = [k for k in ("host", "key", "password") if not config.get(k)]
        if missing:
            raise ConfigurationError(
                f"no HiveMind {', '.join(missing)} configured: pass them in the agent config "
                "or run `hivemind-client set-identity --key ... --password ... --host ...`")
        listed = _hub_list(config["host"])
        mqtt = _mqtt_settings(config)
        if mqtt.get("transport") == "mqtt" and not (config.get("port") or listed[0][2]):
            config = {**config, "port": MQTT_PORTS[listed[0][1]]}
        host, secure, host_port = listed[0]
        (port, timeout, connect_timeout, max_connections, shared, spares, idle_timeout,
         store_max, store_ttl, churn_guard, max_frame, max_sessions, idle_ttl) = \
            _numbers(config, host_port)
        if len(listed) > 1 and host_port:
            port = host_port        # in a list, a hub's own port wins over `port`
        _check_ranges(timeout, connect_timeout, max_connections, shared, spares, idle_timeout,
                      store_max, store_ttl, churn_guard, max_frame, max_sessions, idle_ttl)
        topic = _utterance_topic(config)
        key_dir, store = _directories(config)
        self_signed, ca_file = _tls_trust(config)
        key = str(config["key"])
        default_sid = _default_session_id(config, key)
        if mqtt:   # one session per access key on such a hub: every session shares it
            shared, spares, config = 1, 0, {**config, "share_connections": True}
        return cls(host=host, port=port, key=key, password=str(config["password"]),
                   secure=secure, self_signed=self_signed, ca_file=ca_file,
                   site_id=config.get("site_id") or None,
                   useragent=str(config.get("useragent") or "hivemind-chat-agent"),
                   timeout=timeout, connect_timeout=connect_timeout,
                   max_connections=max_connections, idle_timeout=idle_timeout,
                   shared_connections=shared,
                   share_connections=_flag(config, "share_connections", True),
                   spare_connections=spares,
                   default_session_id=default_sid, session_store=store or None,
                   session_store_max=store_max, session_store_ttl=store_ttl,
                   plays_audio=_flag(config, "plays_audio", False),
                   churn_guard=churn_guard, max_frame_bytes=max_frame,
                   max_sessions=max_sessions, session_idle_ttl=idle_ttl,
                   utterance_topic=topic, noise_key_dir=key_dir, **mqtt,
                   hubs=((host, secure, port),) + tuple(
                       (h, s, p or int(config.get("port") or DEFAULT_PORT))
                       for h, s, p in listed[1:]))


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0", "")


def _flag(config: Dict[str, Any], key: str, default: bool) -> bool:
    """A yes/no key; "false" from a JSON or env-derived config means false, not a truthy str."""
    value = config.get(key, default)
    if isinstance(value, bool) or value is None:
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ConfigurationError(f"{key} must be true or false, not {value!r}")


def _utterance_topic(config: Dict[str, Any]) -> Optional[str]:
    """`utterance_topic`: the topic every utterance is sent on, one of UTTERANCE_TOPICS; None
    (absent or empty) leaves it to whichever the hub allows (core/refusals.py)."""
    topic = config.get("utterance_topic") or None
    if topic is not None and topic not in UTTERANCE_TOPICS:
        raise ConfigurationError(f"utterance_topic must be one of {list(UTTERANCE_TOPICS)} "
                                 "(or absent: whichever the hub allows)")
    return topic


def _directories(config: Dict[str, Any]) -> Tuple[str, Optional[str]]:
    """`noise_key_dir` (where the Noise keys are kept, client/noise_keys.default_key_dir()
    when absent) and `session_store` (where sessions are kept across runs, None: nowhere)."""
    key_dir = config.get("noise_key_dir") or default_key_dir()
    if not isinstance(key_dir, str):
        raise ConfigurationError("noise_key_dir must be a directory path (or absent)")
    store = config.get("session_store")
    if store is not None and not isinstance(store, str):
        raise ConfigurationError("session_store must be a directory path (or absent)")
    return key_dir, store


def _default_session_id(config: Dict[str, Any], key: str) -> str:
    """`default_session_id`, else one derived from the access key (default_session_id_for);
    never "default" itself: a hub drops a client that is not an admin and uses it."""
    default_sid = str(config.get("default_session_id") or default_session_id_for(key))
    if default_sid == "default":
        raise ConfigurationError('default_session_id cannot be "default": a hub drops '
                                 "non-admin clients that use it")
    return default_sid


def _tls_trust(config: Dict[str, Any]) -> Tuple[bool, Optional[str]]:
    """`self_signed` and `ca_file`: how a wss:// hub's certificate is trusted (system CAs when
    neither is set). Both at once would leave unclear which one vouches for the hub."""
    self_signed = _flag(config, "self_signed", False)
    ca_file = config.get("ca_file") or None
    if ca_file is None:
        return self_signed, None
    if not isinstance(ca_file, str):
        raise ConfigurationError("ca_file must be the path of a PEM file (or absent)")
    if self_signed:
        raise ConfigurationError("set either ca_file (verify the hub's certificate against it) "
                                 "or self_signed (pin it at first use), not both")
    ca_file = os.path.abspath(os.path.expanduser(ca_file))
    if not os.path.isfile(ca_file):
        raise ConfigurationError(f"ca_file {ca_file} is not a file; give the path of a PEM file "
                                 "with the hub's CA or the hub's own certificate")
    check_ca_file(ca_file)
    return False, ca_file


def _with_identity(config: Dict[str, Any], identity) -> Dict[str, Any]:
    """The HiveMind client identity's host, port, key, password and site id under `config`,
    read only when the config lacks one of host, key and password."""
    if not (config.get("host") and config.get("key") and config.get("password")):
        identity = identity if identity is not None else _load_identity()
        if identity is not None:
            config.setdefault("host", identity.default_master)
            config.setdefault("port", identity.default_port)
            config.setdefault("key", identity.access_key)
            config.setdefault("password", identity.password)
            config.setdefault("site_id", identity.site_id)
    return config


def _numbers(config: Dict[str, Any], host_port: Optional[int]) -> tuple:
    """The numeric settings, with their defaults, or ConfigurationError naming the bad one."""
    try:
        return (int(config.get("port") or host_port or DEFAULT_PORT),
                float(config.get("timeout", 30)),
                float(config.get("connect_timeout", 10)),
                int(config.get("max_connections", 32)),
                int(config.get("shared_connections", 4)),
                int(config.get("spare_connections", 0)),
                float(config.get("idle_timeout", 300)),
                int(config.get("session_store_max", 1000)),
                float(config.get("session_store_ttl", 30 * 86400)),
                float(config.get("churn_guard", 1.0)),
                int(config.get("max_frame_bytes", 1 << 20)),
                int(config.get("max_sessions", 10_000)),
                float(config.get("session_idle_ttl", 3600)))
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"invalid number in agent config: {e}") from None


def _check_ranges(timeout, connect_timeout, max_connections, shared, spares, idle_timeout,
                  store_max, store_ttl, churn_guard, max_frame, max_sessions, idle_ttl) -> None:
    if not 1 <= shared <= 64:
        raise ConfigurationError("shared_connections must be between 1 and 64")
    if not 0 <= spares <= 64:
        raise ConfigurationError("spare_connections must be between 0 and 64")
    if timeout <= 0 or connect_timeout <= 0 or max_connections < 1 or idle_timeout <= 0 \
            or store_max < 1 or store_ttl <= 0 or churn_guard < 0 \
            or max_frame < 4096 or max_sessions < 1 or idle_ttl <= 0:
        raise ConfigurationError("timeout, connect_timeout, idle_timeout and "
                                 "session_store_ttl must be > 0, max_connections and "
                                 "session_store_max >= 1, churn_guard >= 0, "
                                 "max_frame_bytes >= 4096, max_sessions >= 1, "
                                 "session_idle_ttl > 0")


def default_session_id_for(access_key: str) -> str:
    """A stable stand-in for "default", which a 4.0 hub only accepts from admin clients.

    Derived from the access key so it is the same on every run of this client and different for
    each client; hashed so the id (which the hub logs) reveals nothing of the key.
    """
    digest = hashlib.sha256(f"hivemind-chat-agent:{access_key}".encode()).hexdigest()[:12]
    return f"hivemind-chat-{digest}"


def _hub_list(value: Any) -> List[Tuple[str, bool, Optional[int]]]:
    """`host` as one address, or a list of them (hubs tried in order)."""
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(v, str) and v.strip() for v in value):
            raise ConfigurationError("host must be an address or a non-empty list of them")
        return [_split_host(v) for v in value]
    return [_split_host(str(value))]


def _mqtt_settings(config: Dict[str, Any]) -> Dict[str, Any]:
    """transport, topic_prefix and the broker's credentials, from `host`'s scheme and the
    MQTT keys. Every hub of a list speaks the same transport; an MQTT one has no self_signed
    pinning (a broker's certificate verifies against the system CAs or ca_file)."""
    hosts = config["host"] if isinstance(config["host"], (list, tuple)) else [config["host"]]
    kinds = {str(h).strip().startswith(MQTT_SCHEMES) for h in hosts}
    if len(kinds) > 1:
        raise ConfigurationError("host: a list cannot mix mqtt:// brokers and websocket hubs")
    if not kinds.pop():
        return {}
    if _flag(config, "self_signed", False):
        raise ConfigurationError("self_signed is for wss:// hubs; an mqtts:// broker's "
                                 "certificate verifies against the system CAs or ca_file")
    prefix = str(config.get("topic_prefix") or "hivemind").strip("/")
    if not prefix or any(c in prefix for c in "+#"):
        raise ConfigurationError("topic_prefix must be the hub's MQTT topic prefix, without "
                                 "wildcards (+ #); hivemind-mqtt-protocol's default is "
                                 '"hivemind"')
    user, secret = config.get("broker_username"), config.get("broker_password")
    if secret and not user:
        raise ConfigurationError("broker_password needs broker_username")
    return {"transport": "mqtt", "topic_prefix": prefix,
            "broker_username": str(user) if user else None,
            "broker_password": str(secret) if secret else None}


def _split_host(host: str):
    """("wss://hub.lan:5678/") -> ("hub.lan", True, 5678); the port part is optional.
    mqtt:// and mqtts:// (a broker) read the same way."""
    host = host.strip()
    secure = host.startswith(("wss://", "mqtts://"))
    for prefix in ("wss://", "ws://", "mqtts://", "mqtt://"):
        if host.startswith(prefix):
            host = host[len(prefix):]
    host = host.rstrip("/")
    port = None
    if host.count(":") == 1:    # host:port (a bare IPv6 address has several colons)
        host, _, port_text = host.partition(":")
        if not port_text.isdigit():
            raise ConfigurationError(f"invalid port {port_text!r} in host")
        port = int(port_text)
    if not host or "/" in host:
        raise ConfigurationError(f"invalid host {host!r} in agent config: use 127.0.0.1, "
                                 "ws://host, wss://host, mqtt://broker or mqtts://broker")
    return host, secure, port


def _load_identity():
    try:
        from hivemind_bus_client.identity import NodeIdentity
        return NodeIdentity()
    except Exception:  # an unreadable identity file is the same as none
        return None
