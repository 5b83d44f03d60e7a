"""`hivemind-chat wyoming`'s command line: its options, the checks made before anything
starts (an allow list beyond loopback: Wyoming has no authentication), and serving in
bridges/serving's shell until a stop signal. bridges/cli.py hands `hivemind-chat wyoming`
here."""
from typing import Any, Dict

from hivemind_chat_agent.bridges import serving
from hivemind_chat_agent.extras import require

DEFAULT_URI = "tcp://0.0.0.0:10700"     # what Home Assistant setups use: with --allow-from


def parse_uri(uri: str):
    """tcp://HOST:PORT, as Wyoming servers take it (no host: 0.0.0.0); bridges/serving's
    Address, or a ConfigurationError naming --uri."""
    return serving.parse_uri(uri, "--uri", ("tcp",), "tcp://0.0.0.0:10700",
                             default_host="0.0.0.0")


def add_options(p):
    """`hivemind-chat wyoming`'s options on top of the CLI's hub options, in the order --help
    lists them: where it listens and whom it admits, what it tells Home Assistant and how it
    answers, then how it runs beside the hub."""
    p.prog = "hivemind-chat wyoming"
    p.description = ("Serve Home Assistant's Assist (its Wyoming Protocol integration) as a "
                     "conversation agent answered by the OVOS hub: each transcript is a turn.")
    _add_admission_options(p)
    _add_answer_options(p)
    _add_running_options(p)
    return p


def _add_admission_options(p) -> None:
    """Where it listens, who may connect (Wyoming has no authentication: an allow list) and
    how much one peer and everyone may hold open, and for how long."""
    p.add_argument("--uri", default=DEFAULT_URI,
                   help=f"where to listen (default {DEFAULT_URI}; beyond loopback it needs "
                        "--allow-from)")
    p.add_argument("--allow-from", action="append", default=[], metavar="ADDR[/PREFIX]",
                   help="who may connect: an address or network, IPv4 or IPv6 (repeatable), "
                        "e.g. the Home Assistant host 192.168.1.20. Wyoming has no "
                        "authentication: without this only loopback peers are answered, and "
                        "listening beyond loopback is refused")
    p.add_argument("--max-connections", type=serving.count_option, default=64, metavar="N",
                   help="connections open at once, from everyone (default 64); more are "
                        "closed at accept")
    p.add_argument("--max-connections-per-peer", type=serving.count_option, default=32, metavar="N",
                   help="connections open at once from one address (default 32; Home "
                        "Assistant opens one per turn)")
    p.add_argument("--max-turns-per-peer", type=serving.count_option, default=20, metavar="N",
                   help="turns in flight for one address (default 20: Home Assistant's 20 "
                        "satellites at once, and what the hub plugin queues per client); "
                        "more wait for a place, at most --timeout, then hear that the "
                        "assistant is busy")
    p.add_argument("--idle-timeout", type=serving.seconds_option, default=30.0, metavar="SECONDS",
                   help="a connection whose next event is not complete within this is closed "
                        "(default 30)")
    p.add_argument("--read-timeout", type=serving.seconds_option, default=10.0, metavar="SECONDS",
                   help="once an event has begun, each of its reads (header line, data "
                        "block, payload) must complete within this (default 10)")


def _add_answer_options(p) -> None:
    """What Home Assistant is told the agent can do (languages, home control, mDNS) and how a
    turn is answered (its session, streamed or whole)."""
    p.add_argument("--languages", nargs="*", default=[],
                   help="languages to advertise, e.g. en-US de-DE (default: all)")
    p.add_argument("--session-per-device", action="store_true",
                   help="one OVOS session per satellite/device instead of one per HA "
                        "conversation")
    p.add_argument("--stream", action="store_true",
                   help="answer with HandledStart, a HandledChunk per sentence as it arrives, "
                        "the full Handled, then HandledStop (the Wyoming spec's order), and "
                        "advertise it; Home Assistant's conversation agent takes it (it reads "
                        "the full Handled and skips the rest), clients that stream hear the "
                        "first sentence sooner")
    p.add_argument("--no-home-control", dest="home_control", action="store_false",
                   help="do not advertise supports_home_control (advertised by default: "
                        "Home Assistant 2026.6+ otherwise tells users the assistant cannot "
                        "control the home); for hubs without a smart-home skill")
    p.add_argument("--zeroconf", nargs="?", const="", metavar="NAME",
                   help="announce the service over mDNS (_wyoming._tcp) so Home Assistant "
                        "discovers it; needs the zeroconf package")


def _add_running_options(p) -> None:
    """How it runs beside the hub: the agent's churn spacing, its spare 4.x connections and
    the Prometheus metrics endpoint."""
    p.add_argument("--churn-guard", type=float, default=None, metavar="SECONDS",
                   help="the agent's churn_guard (default 1): 0 for hubs whose answers come "
                        "from a persona or LLM rather than skills speaking with wait=True; "
                        "many conversations at once then start without spacing")
    p.add_argument("--metrics", default=None, metavar="HOST:PORT",
                   help="serve Prometheus metrics (GET /metrics, with /healthz and /readyz) "
                        "on this address, e.g. 127.0.0.1:9108; loopback peers only unless "
                        "--metrics-allow-from names others; needs the [metrics] extra "
                        "(docs/metrics.md). Off by default")
    p.add_argument("--metrics-allow-from", action="append", default=[],
                   metavar="ADDR[/PREFIX]",
                   help="who may read --metrics beyond loopback (repeatable), e.g. the "
                        "Prometheus server; required when --metrics is not on loopback")
    p.add_argument("--spare-connections", type=int, default=2, metavar="N",
                   help="on a HiveMind 4.x hub, keep N connections with the handshake done, "
                        "so a new conversation pays none (default 2; 0 to keep none); 5.x "
                        "hubs carry every conversation over one connection and need none")


def check_args(args) -> None:
    """Before anything starts (cli.main calls it): the URI and the allow list. Listening
    beyond loopback without --allow-from is a ConfigurationError (exit 2) saying why; so is
    --metrics beyond loopback without --metrics-allow-from, or without the [metrics] extra."""
    guard_for(args)
    metrics_address(args)


def metrics_address(args):
    """(host, port) of --metrics, checked with its allow list, or None when off."""
    if not getattr(args, "metrics", None):
        return None
    from hivemind_chat_agent.core.health import parse_address
    from hivemind_chat_agent.core.peer_gate import AllowList
    from hivemind_chat_agent.errors import ConfigurationError
    require("metrics", "--metrics of hivemind-chat wyoming")
    try:
        host, port = parse_address(args.metrics)
    except ValueError:
        raise ConfigurationError(f"--metrics must be HOST:PORT (e.g. 127.0.0.1:9108), not "
                                 f"{args.metrics!r}") from None
    AllowList.for_bind(host, args.metrics_allow_from, "the metrics endpoint of hivemind-chat "
                       "wyoming", f"--metrics {host}:{port} --metrics-allow-from 10.0.0.2",
                       option="--metrics-allow-from")
    return host, port


def guard_for(args, turn_wait: float = 30.0):
    """((host, port), Guard) from the command line; ConfigurationError for a bad --uri, a
    bad --allow-from, or none beyond loopback."""
    from hivemind_chat_agent.bridges.wyoming_connection import Guard
    from hivemind_chat_agent.bridges.wyoming_events import Deadlines
    from hivemind_chat_agent.core.peer_gate import AllowList, Caps, PeerGate
    where = parse_uri(args.uri)
    host, port = where.host, where.port
    allow = AllowList.for_bind(host, args.allow_from, "the Wyoming server",
                               f"hivemind-chat wyoming --uri {args.uri} "
                               "--allow-from 192.168.1.20")
    caps = Caps(args.max_connections, args.max_connections_per_peer, args.max_turns_per_peer)
    guard = Guard(PeerGate(allow, caps), Deadlines(args.idle_timeout, args.read_timeout),
                  turn_wait=turn_wait)
    return (host, port), guard


def serve_from_cli(args, out, config: Dict[str, Any]) -> int:
    """`hivemind-chat wyoming` in bridges/serving's shell, until a stop signal (the turns in
    flight finish first); `config` is the CLI's agent config."""
    from hivemind_chat_agent.bridges import front_metrics
    from hivemind_chat_agent.bridges.wyoming_bridge import WyomingBridge
    from hivemind_chat_agent.bridges.wyoming_server import run_server, turn_wait_of
    require("wyoming", "hivemind-chat wyoming (Home Assistant's Wyoming Protocol)")
    guard_for(args)                      # refused before the hub is dialled
    metrics_address(args)
    metrics = front_metrics.metrics_for("wyoming", bool(args.metrics))
    with serving.front_agent(config, "hivemind-chat-wyoming", observer=metrics,
                             churn_guard=args.churn_guard,
                             spare_connections=args.spare_connections) as agent:
        bridge = WyomingBridge(agent, args.languages, args.session_per_device,
                               version=_version(), stream=args.stream,
                               home_control=args.home_control)
        (host, port), guard = guard_for(args, turn_wait_of(bridge))
        endpoint = None
        if metrics is not None:
            guard.metrics = metrics
            endpoint = front_metrics.serve_on(metrics, args.metrics, args.metrics_allow_from,
                                              "wyoming")
            mhost, mport = endpoint.address
            out.info(f"metrics at http://{mhost}:{mport}/metrics")
        out.info(f"Wyoming conversation service on tcp://{host}:{port}, answering "
                 f"{guard.gate.allow.describe()}: in Home Assistant, add the Wyoming "
                 "Protocol integration with this host and port")
        try:
            return serving.serve_until_signalled(
                lambda stopping: run_server(bridge, host, port, zeroconf=args.zeroconf,
                                            say=out.info, warm=True, guard=guard,
                                            stopping=stopping), args.uri)
        finally:
            if endpoint is not None:
                endpoint.stop()


def _version() -> str:
    try:
        import importlib.metadata
        return importlib.metadata.version("hivemind-chat-agent")
    except Exception:
        return ""




__all__ = ["add_options", "check_args", "serve_from_cli", "parse_uri", "guard_for",
           "metrics_address", "DEFAULT_URI"]
