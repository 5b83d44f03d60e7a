"""`hivemind-chat wyoming`: Home Assistant's Assist talks to an OVOS hub through Wyoming.

Home Assistant's built-in Wyoming integration turns a Wyoming "handle" service into a
conversation agent (homeassistant/components/wyoming/conversation.py): per turn it opens a TCP
connection, sends `Transcript(text, context={conversation_id, device_id?, satellite_id?},
language)`, and reads events until `Handled(text)` or `NotHandled(text)`, skipping any others.
Each transcript here is one turn of `HiveMindChatAgent` through its asyncio API, so nothing
blocks the loop and many conversations run at once.

What HA hears is always one of those two events, before the agent's own timeout has passed:
the sentences joined with "\\n" (HA's own separator for several answers), or, when the hub
understood nothing, failed, went silent or is unreachable, a sentence a person can hear saying
why. A bad event, a half-closed or hostile connection costs only that connection.

bridges/cli.py hands `hivemind-chat wyoming` to `add_options` / `serve_from_cli` at the end.
"""
import asyncio
import hashlib
import json
import logging
from typing import Any, Dict, List, Optional, Tuple

from hivemind_chat_agent.core.outcomes import TurnStatus
from hivemind_chat_agent.extras import install_hint, require
from hivemind_chat_agent.errors import (AuthenticationError, ConnectionLostError,
                                        HiveMindChatError, HubUnreachableError,
                                        PolicyDeniedError, TurnTimeoutError)

LOG = logging.getLogger(__name__)

MAX_LINE = 64 * 1024          # one event header; HA's transcripts are a few hundred bytes
MAX_DATA = 64 * 1024          # its data block
READ_TIMEOUT = 60.0           # an idle connection (HA opens one per turn) is closed after it

# What a person hears when the hub gives no answer (English; the hub's own words when it has
# them come through as its sentences).
SPOKEN = {
    "not_understood": "Sorry, I didn't understand that.",
    "timed_out": "Sorry, the assistant took too long to answer.",
    "unreachable": "Sorry, I can't reach the assistant right now.",
    "refused": "Sorry, the assistant refused this request. Its log says why.",
    "failed": "Sorry, something went wrong on the assistant.",
}


def session_for(context: Dict[str, Any], peer: str, per_device: bool) -> Tuple[str, str]:
    """(OVOS session id, site id) for a transcript. HA's conversation_id is stable across its
    follow-up turns; it is namespaced by the asking HA (its address) and device, so two HA
    instances or devices never share a session. `per_device`: one session per satellite."""
    device = str(context.get("satellite_id") or context.get("device_id") or "")
    conversation = str(context.get("conversation_id") or "")
    namespace = hashlib.sha256(f"{peer}\0{device}".encode()).hexdigest()[:12]
    if per_device or not conversation:
        return f"ha-{namespace}", device or "home-assistant"
    return f"ha-{namespace}-{conversation[:64]}", device or "home-assistant"


class WyomingBridge:
    """The server's state: the agent and what it advertises."""

    def __init__(self, agent, languages: Optional[List[str]] = None, per_device: bool = False,
                 version: str = "", stream: bool = False):
        self.agent = agent
        self.languages = languages or []
        self.per_device = per_device
        self.version = version
        # Home Assistant's conversation client (2026) reads only Handled/NotHandled and skips
        # the streaming events, so it would wait for an answer that never comes: streaming is
        # for clients the operator knows take it (`--stream`), and advertised only then.
        self.stream = stream

    def info_event(self):
        from wyoming.info import Attribution, HandleModel, HandleProgram, Info
        attribution = Attribution(name="OpenVoiceOS / HiveMind",
                                  url="https://github.com/JarbasHiveMind")
        model = HandleModel(name="ovos-hub", attribution=attribution, installed=True,
                            description="the skills of an OVOS hub, over HiveMind",
                            version=self.version, languages=list(self.languages))
        program = HandleProgram(name="hivemind-chat", attribution=attribution, installed=True,
                                description="An OVOS hub (its skills, follow-up questions "
                                            "and sessions) reached over HiveMind",
                                version=self.version, models=[model],
                                supports_handled_streaming=self.stream)
        return Info(handle=[program]).event()

    async def warm_up(self, say=lambda text: None) -> None:
        """Connect at start, so that a wrong key or a dead hub is told now rather than at the
        first transcript, and a 4.x hub's spare connections are ready for new conversations."""
        try:
            await self.agent.awarm_up()
        except HiveMindChatError as e:
            say(f"the hub is not ready ({type(e).__name__}: {e}); until it is, each transcript "
                "is answered NotHandled saying so")
            return
        say("connected to the hub")

    async def answer(self, text: str, context: Dict[str, Any], language: Optional[str],
                     peer: str):
        """The events answering one transcript, ending with Handled, NotHandled or (when
        streaming) HandledStop; never raises. Streamed chunks concatenate to the text a
        Handled would carry."""
        from wyoming.handle import (Handled, HandledChunk, HandledStart, HandledStop,
                                    NotHandled)
        session_id, site_id = session_for(context, peer, self.per_device)
        sentences: List[str] = []
        failure = ""
        try:
            turn = await self.agent.abegin([{"role": "user", "content": text}],
                                           session_id=session_id, lang=language or None,
                                           site_id=site_id)
            async for sentence in turn:
                if self.stream:
                    if not sentences:
                        yield HandledStart().event()
                    yield HandledChunk(text=("\n" if sentences else "") + sentence).event()
                sentences.append(sentence)
            if not sentences:
                failure = "not_understood" if turn.status is not TurnStatus.TIMED_OUT \
                    else "timed_out"
        except TurnTimeoutError:
            failure = "timed_out"
        except (HubUnreachableError, AuthenticationError, ConnectionLostError) as e:
            LOG.warning(f"the hub is out of reach: {e}")
            failure = "unreachable"
        except PolicyDeniedError as e:
            LOG.warning(f"the hub refused the transcript: {e}")
            failure = "refused"
        except HiveMindChatError as e:
            LOG.warning(f"a turn failed: {type(e).__name__}: {e}")
            failure = "failed"
        if self.stream and sentences:      # what was said stands, whatever ended the turn
            yield HandledStop().event()
        elif sentences:
            yield Handled(text="\n".join(sentences)).event()
        else:
            yield NotHandled(text=SPOKEN[failure or "not_understood"]).event()


async def read_event(reader: asyncio.StreamReader):
    """One Wyoming event, bounded (the wyoming package's reader trusts the announced sizes);
    None at the end of the stream or for anything malformed."""
    from wyoming.event import Event
    line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT)
    if not line:
        return None
    header = json.loads(line)
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ValueError("not a Wyoming event")
    data = header.get("data") or {}
    size = header.get("data_length") or 0
    if not isinstance(data, dict) or not isinstance(size, int) or not 0 <= size <= MAX_DATA:
        raise ValueError("bad data")
    if size:
        extra = json.loads(await asyncio.wait_for(reader.readexactly(size), READ_TIMEOUT))
        if not isinstance(extra, dict):
            raise ValueError("bad data block")
        data.update(extra)
    payload = header.get("payload_length") or 0
    if not isinstance(payload, int) or not 0 <= payload <= MAX_DATA:
        raise ValueError("bad payload")
    if payload:
        await asyncio.wait_for(reader.readexactly(payload), READ_TIMEOUT)   # not ours: skip
    return Event(type=header["type"], data=data)


async def serve_connection(bridge: WyomingBridge, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
    """One client connection: Describe -> Info, Transcript -> Handled/NotHandled, anything
    else ignored, until the client closes, goes idle, or sends garbage."""
    from wyoming.asr import Transcript
    from wyoming.event import async_write_event
    from wyoming.info import Describe
    peer = str((writer.get_extra_info("peername") or ("?",))[0])
    try:
        while True:
            try:
                event = await read_event(reader)
            except (ValueError, asyncio.IncompleteReadError, asyncio.TimeoutError,
                    ConnectionError) as e:
                LOG.debug(f"closing a Wyoming connection from {peer}: {type(e).__name__}")
                return
            if event is None:
                return
            if Describe.is_type(event.type):
                await async_write_event(bridge.info_event(), writer)
            elif Transcript.is_type(event.type):
                text = event.data.get("text")
                context = event.data.get("context")
                language = event.data.get("language")
                if not isinstance(text, str) or not text.strip():
                    from wyoming.handle import NotHandled
                    await async_write_event(NotHandled(text=SPOKEN["not_understood"]).event(),
                                            writer)
                    continue
                async for answer in bridge.answer(
                        text, context if isinstance(context, dict) else {},
                        language if isinstance(language, str) else None, peer):
                    await async_write_event(answer, writer)
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def advertise(port: int, host: str, name: Optional[str]) -> Optional[str]:
    """Announce `_wyoming._tcp` over mDNS, as other Wyoming servers do, so Home Assistant
    discovers the service; None when announced, else why not (the server serves anyway)."""
    import importlib.util
    if host.startswith("127.") or host == "localhost":
        return (f"not announced: {host} is reachable from this machine only; listen on "
                "0.0.0.0 or a LAN address for Home Assistant to find it")
    if importlib.util.find_spec("zeroconf") is None:
        return (f"discovery needs the [zeroconf] extra ({install_hint('zeroconf')}); add "
                "the Wyoming integration in Home Assistant by host and port instead")
    from wyoming.zeroconf import HomeAssistantZeroconf
    try:
        announcer = HomeAssistantZeroconf(port=port, name=name or None,
                                          host=None if host in ("", "0.0.0.0") else host)
        await announcer.register_server()
    except OSError as e:
        return (f"multicast is unavailable here ({e.strerror or e}); add the Wyoming "
                "integration in Home Assistant by host and port instead")
    return None


async def run_server(bridge: WyomingBridge, host: str, port: int,
                     started: Optional[asyncio.Future] = None,
                     zeroconf: Optional[str] = None,
                     say=lambda text: None, warm: bool = False) -> None:
    """Serve until cancelled. `zeroconf`: announce under that name ("" for the default);
    `warm`: connect to the hub at once (`WyomingBridge.warm_up`) while serving."""
    connections = set()

    async def connection(reader, writer):
        task = asyncio.current_task()
        connections.add(task)
        try:
            await serve_connection(bridge, reader, writer)
        finally:
            connections.discard(task)
    server = await asyncio.start_server(connection, host=host, port=port, limit=MAX_LINE)
    if started is not None and not started.done():
        started.set_result(server.sockets[0].getsockname()[1])
    if warm:
        connections.add(asyncio.create_task(bridge.warm_up(say)))
    if zeroconf is not None:
        why_not = await advertise(port, host, zeroconf)
        say(why_not or f"announced on the network as {zeroconf or 'this machine'} "
                       "(_wyoming._tcp): Home Assistant offers to add it")
    try:
        async with server:
            await server.serve_forever()
    finally:       # stopping: the connections in progress end with the server
        for task in list(connections):
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)


def parse_uri(uri: str) -> Tuple[str, int]:
    """tcp://HOST:PORT, as Wyoming servers take it."""
    from urllib.parse import urlparse
    parsed = urlparse(uri)
    if parsed.scheme != "tcp" or parsed.port is None:
        raise ValueError(f"--uri must look like tcp://0.0.0.0:10700, not {uri!r}")
    return parsed.hostname or "0.0.0.0", parsed.port


# ---- the command line (bridges/cli.py hands `hivemind-chat wyoming` here) ----
def add_options(p):
    """`hivemind-chat wyoming`'s options on top of the CLI's hub options."""
    p.prog = "hivemind-chat wyoming"
    p.description = ("Serve Home Assistant's Assist (its Wyoming Protocol integration) as a "
                     "conversation agent answered by the OVOS hub: each transcript is a turn.")
    p.add_argument("--uri", default="tcp://0.0.0.0:10700",
                   help="where to listen (default tcp://0.0.0.0:10700)")
    p.add_argument("--languages", nargs="*", default=[],
                   help="languages to advertise, e.g. en-US de-DE (default: all)")
    p.add_argument("--session-per-device", action="store_true",
                   help="one OVOS session per satellite/device instead of one per HA "
                        "conversation")
    p.add_argument("--stream", action="store_true",
                   help="answer with HandledStart/HandledChunk/HandledStop as sentences "
                        "arrive, and advertise it; only for clients that take them (Home "
                        "Assistant's conversation agent, as of 2026, does not)")
    p.add_argument("--zeroconf", nargs="?", const="", metavar="NAME",
                   help="announce the service over mDNS (_wyoming._tcp) so Home Assistant "
                        "discovers it; needs the zeroconf package")
    p.add_argument("--churn-guard", type=float, default=None, metavar="SECONDS",
                   help="the agent's churn_guard (default 1): 0 for hubs whose answers come "
                        "from a persona or LLM rather than skills speaking with wait=True; "
                        "many conversations at once then start without spacing")
    p.add_argument("--spare-connections", type=int, default=2, metavar="N",
                   help="on a HiveMind 4.x hub, keep N connections with the handshake done, "
                        "so a new conversation pays none (default 2; 0 to keep none); 5.x "
                        "hubs carry every conversation over one connection and need none")
    return p


def serve_from_cli(args, out, config: Dict[str, Any]) -> int:
    """`hivemind-chat wyoming`: serve until Ctrl-C; `config` is the CLI's agent config."""
    from hivemind_chat_agent import background
    from hivemind_chat_agent.errors import ConfigurationError
    require("wyoming", "hivemind-chat wyoming (Home Assistant's Wyoming Protocol)")
    from hivemind_chat_agent.client.agent import HiveMindChatAgent
    try:
        host, port = parse_uri(args.uri)
    except ValueError as e:
        raise ConfigurationError(str(e)) from None
    config = dict(config)
    config["useragent"] = "hivemind-chat-wyoming"
    if args.churn_guard is not None:
        config["churn_guard"] = args.churn_guard
    config["spare_connections"] = args.spare_connections
    agent = HiveMindChatAgent(config)
    try:
        bridge = WyomingBridge(agent, args.languages, args.session_per_device,
                               version=_version(), stream=args.stream)
        out.info(f"Wyoming conversation service on tcp://{host}:{port}: in Home Assistant, "
                 "add the Wyoming Protocol integration with this host and port")
        background.unblock_signals()
        try:
            asyncio.run(run_server(bridge, host, port, zeroconf=args.zeroconf, say=out.info,
                                   warm=True))
        except OSError as e:
            raise ConfigurationError(f"cannot listen on {args.uri}: {e.strerror or e}") from None
        except KeyboardInterrupt:
            return 0
        return 0
    finally:
        agent.shutdown()


def _version() -> str:
    try:
        import importlib.metadata
        return importlib.metadata.version("hivemind-chat-agent")
    except Exception:
        return ""


__all__ = ["WyomingBridge", "run_server", "serve_connection", "session_for", "parse_uri",
           "add_options", "serve_from_cli"]
