"""`hivemind-chat mcp`: a Model Context Protocol server (the official `mcp` SDK, extra `[mcp]`)
whose one tool, `ask`, puts an utterance to the OVOS hub through `HiveMindChatAgent`, so an LLM
in Claude Desktop, Open WebUI or any MCP client can use the hub's skills.

    ask(utterance, conversation=None) -> the hub's sentences as text, and structured content
        {"answer", "expect_response", "conversation", "complete"}: `expect_response` true means
        a skill asked a question and the next `ask` of that conversation answers it.

MCP clients give a call a time budget (Home Assistant: 10 s): an answer still being spoken at
`--tool-timeout` (default 8 s) is returned in part with `complete: false`, the turn goes on at
the hub, and an `ask` with an empty utterance in that conversation returns the rest
(bridges/mcp_asks.py). `conversation` names an OVOS session (kept across calls). Without it:
over stdio the process's own conversation (one client launched it); over HTTP the MCP
session's, when the client has one (`Mcp-Session-Id`, protocols before 2026-07-28), else the
server's default conversation: the 2026-07-28 protocol is stateless over HTTP, so clients that
share a server should name theirs. The result names the conversation it ran in; names are at
most MAX_CONVERSATION bytes. Over stdio by default (what desktop clients launch), streamable
HTTP with `--http`: behind bridges/http_front's guard like the OpenAI front (Host and Origin
checked on every bind address, and by the SDK's own TransportSecuritySettings with explicit
lists; off loopback a Bearer key is required; each key its own conversations; deadlines and
caps), and a caller who hangs up stops its turn. A hub failure is a tool error naming the hub
and the failure, for the model to read (the agent's full message, which may quote addresses or
paths, goes to the log).
"""
import uuid
from collections import OrderedDict
from typing import Any, Dict, Optional

from hivemind_chat_agent.bridges import http_front, serving
from hivemind_chat_agent.bridges.mcp_asks import (
    DEFAULT_BUDGET,
    DEFAULT_KEEP_FOR,
    DEFAULT_PER_CALLER,
    BudgetedAsks,
)
from hivemind_chat_agent.errors import HiveMindChatError

MCP_PATH = "/mcp"

TOOL_DESCRIPTION = (
    "Say something to the OVOS voice assistant hub (its skills: time, weather, timers, "
    "alarms, music, smart home, or whatever it runs) and get its spoken answer. When "
    "expect_response is true the assistant asked a question: answer it with another ask in "
    "the same conversation. When complete is false the assistant is still speaking: call ask "
    "again with an empty utterance and the same conversation for the rest.")


class ConversationNames:
    """A stable default conversation per MCP session: one per process over stdio (one client
    launched it), one per `Mcp-Session-Id` over HTTP when there is one (bounded, least recently
    used forgotten), the process's otherwise."""

    def __init__(self, limit: int = 10000):
        self._names: "OrderedDict[str, str]" = OrderedDict()
        self._limit = limit
        self._process = f"mcp-{uuid.uuid4().hex[:12]}"

    def default_for(self, mcp_session: Optional[str]) -> str:
        if not mcp_session:
            return self._process
        name = self._names.pop(mcp_session, None) or f"mcp-{uuid.uuid4().hex[:12]}"
        self._names[mcp_session] = name
        while len(self._names) > self._limit:
            self._names.popitem(last=False)
        return name


def answer_text(result: Dict[str, Any]) -> str:
    """The result's text content, what a model reads first: the sentences, and when the answer
    is unfinished how to get the rest."""
    text = result["answer"]
    if not result["complete"]:
        hint = ("(the assistant is still speaking: call ask with an empty utterance and "
                f"conversation {result['conversation']!r} for the rest)")
        return f"{text}\n{hint}" if text else hint
    return text or "(the hub had no answer)"


def build_server(agent, names: Optional[ConversationNames] = None,
                 asks: Optional[BudgetedAsks] = None):
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import CallToolResult, TextContent
    from pydantic import BaseModel

    from hivemind_chat_agent.bridges.hub_failures import hub_address, hub_failure
    names = names or ConversationNames()
    asks = asks or BudgetedAsks(agent)
    hub = hub_address(agent)
    server = MCPServer(name="hivemind-chat", instructions=TOOL_DESCRIPTION,
                       log_level="WARNING")

    class Answer(BaseModel):
        answer: str
        expect_response: bool
        conversation: str
        complete: bool

    @server.tool(description=TOOL_DESCRIPTION)
    async def ask(utterance: str, ctx: Context, conversation: Optional[str] = None) -> Answer:
        name = (conversation or "").strip() or names.default_for(_session_of(ctx))
        scope = _scope_of(ctx)
        try:
            result = await asks.ask(utterance, name, scope.get(http_front.CALLER, ""))
        except ValueError as e:
            raise ToolError(str(e)) from None
        except HiveMindChatError as e:      # the hub and the failure; the details to the log
            raise ToolError(hub_failure(e, hub).message) from None
        # the SDK sends a CallToolResult as it is; `Answer` above declares its output schema
        return CallToolResult(content=[TextContent(type="text", text=answer_text(result))],  # type: ignore[return-value]
                              structured_content=result)

    return server


def _scope_of(ctx) -> Dict[str, Any]:
    """The ASGI scope of the HTTP request carrying this call ({} over stdio)."""
    try:
        return getattr(ctx.request_context.request, "scope", None) or {}
    except Exception:       # outside a request
        return {}


def _session_of(ctx) -> Optional[str]:
    """The MCP session id the client sent (streamable HTTP), or None (stdio)."""
    try:
        headers = ctx.headers or {}
    except Exception:       # outside a request
        return None
    return next((v for k, v in headers.items() if k.lower() == "mcp-session-id"), None)


# ---- the command line (bridges/cli.py hands `hivemind-chat mcp` here) ----
def add_options(p):
    p.prog = "hivemind-chat mcp"
    p.description = ("Serve a Model Context Protocol tool, `ask`, that puts an utterance to the "
                     "OVOS hub: over stdio (what MCP clients launch), or streamable HTTP with "
                     "--http.")
    p.add_argument("--http", nargs="?", const="http://127.0.0.1:8765", default=None,
                   metavar="URI", help="serve streamable HTTP at URI (default "
                   "http://127.0.0.1:8765, path /mcp) instead of stdio; another address "
                   "than loopback needs an API key")
    p.add_argument("--tool-timeout", type=serving.seconds_option, default=DEFAULT_BUDGET,
                   metavar="SECONDS",
                   help=f"the time budget of one ask (default {DEFAULT_BUDGET:g}: Home "
                   "Assistant gives a tool call 10 s): an answer still being spoken then is "
                   "returned in part with complete: false, and an ask with an empty utterance "
                   "in that conversation returns the rest")
    p.add_argument("--keep-unfinished", type=serving.seconds_option, default=DEFAULT_KEEP_FOR,
                   metavar="SECONDS", help="an unfinished answer nobody comes back for is "
                   f"stopped and forgotten this long after its last part (default "
                   f"{DEFAULT_KEEP_FOR:g})")
    p.add_argument("--max-unfinished-per-caller", type=serving.count_option,
                   default=DEFAULT_PER_CALLER, metavar="N",
                   help=f"unfinished answers kept per caller (default {DEFAULT_PER_CALLER}); "
                   "a new one stops the oldest")
    serving.add_key_options(p)
    http_front.add_limit_options(p)
    return p




def asks_from(args, agent) -> BudgetedAsks:
    """The `ask` tool's turns with the command line's budget and bounds."""
    return BudgetedAsks(agent, args.tool_timeout, args.keep_unfinished,
                        args.max_unfinished_per_caller)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def jsonrpc_error(refusal) -> Dict[str, Any]:
    """A guard's refusal as a JSON-RPC error object, what MCP clients read."""
    return {"jsonrpc": "2.0", "id": None,
            "error": {"code": -32001 if refusal.status in (401, 403, 421) else -32000,
                      "message": refusal.message, "data": {"code": refusal.code}}}


def http_app(server, guard, limits: http_front.Limits = http_front.Limits(), metrics=None):
    """The SDK's streamable HTTP app behind the guard. The SDK checks Host and Origin again
    with the same explicit lists (its own check is on only for 127.0.0.1, localhost and ::1
    when left to itself)."""
    from mcp.server.transport_security import TransportSecuritySettings
    hosts = sorted({_bracketed(h) for h in guard.hosts} | {"127.0.0.1", "localhost", "[::1]"})
    security = TransportSecuritySettings(
        allowed_hosts=hosts + [f"{h}:*" for h in hosts],
        allowed_origins=[f"{scheme}://{_bracketed(host)}:{port}"
                         for scheme, host, port in guard.origins]
        + [f"{scheme}://{h}:*" for h in ("127.0.0.1", "localhost", "[::1]")
           for scheme in ("http", "https")])
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, transport_security=security,
                                     max_request_body_size=limits.max_body)
    return http_front.GuardedApp(app, guard, jsonrpc_error, turn_paths=(MCP_PATH,),
                                 max_body=limits.max_body, metrics=metrics)


class StdinRelay:
    """The MCP channel (stdin) handed to the SDK through a socket pair of ours, so that a stop
    signal can end it. The SDK reads its lines on a worker thread the interpreter waits for at
    exit, and a read of the client's stdin ends only when the client writes or closes it: a
    SIGTERM would wait for the client. Here a daemon thread copies stdin into the pair, and
    `close()` ends the SDK's side (it reads the end of its channel and returns); the client
    closing stdin ends it as before."""

    def __init__(self):
        import io
        import socket
        import sys
        import threading

        from hivemind_chat_agent import background
        self._ours, theirs = socket.socketpair()
        self._saved = sys.stdin
        sys.stdin = io.TextIOWrapper(theirs.makefile("rb"), encoding="utf-8",
                                     errors="replace")
        self._theirs = theirs
        background.start(threading.Thread(target=self._copy, daemon=True,
                                          name="hivemind-chat-mcp-stdin"))

    def _copy(self) -> None:
        import os
        try:
            while True:
                chunk = os.read(0, 65536)
                if not chunk:
                    break
                self._ours.sendall(chunk)
        except OSError:       # stdin broken, or close() came first
            pass
        self.close()

    def close(self) -> None:
        """End the SDK's channel (idempotent), and give sys.stdin back."""
        import socket
        import sys
        try:
            self._ours.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if sys.stdin is not self._saved and self._saved is not None:
            sys.stdin, self._saved = self._saved, None


async def serve_stdio(server, stopping) -> None:
    """The MCP server over stdio until the client closes it or `stopping` is set (then the
    channel ends, and with it the server)."""
    import asyncio
    relay = StdinRelay()

    async def close_when_stopping():
        await stopping.wait()
        relay.close()
    watch = asyncio.ensure_future(close_when_stopping())
    try:
        await server.run_stdio_async()
    finally:
        watch.cancel()
        relay.close()


def check_args(args) -> None:
    """Over stdio, stdin is the MCP channel: no password prompt may read it."""
    from hivemind_chat_agent.errors import ConfigurationError
    if args.http is None and args.password == "-":
        raise ConfigurationError(
            "--password - would read the MCP channel (stdin): set the identity once with "
            "`hivemind-client set-identity`, or pass the password itself")


def serve_from_cli(args, out, config: Dict[str, Any]) -> int:
    """`hivemind-chat mcp` in bridges/serving's shell: over stdio until the client closes it
    or a stop signal; over HTTP refused before the hub is dialled when the address or the
    keys do not do, and a stop signal drains the calls in flight."""
    if args.http is None:
        if args.metrics:
            from hivemind_chat_agent.errors import ConfigurationError
            raise ConfigurationError("--metrics needs --http: over stdio there is no server "
                                     "to serve /metrics on")
        with serving.front_agent(config, "hivemind-chat-mcp") as agent:
            server = build_server(agent, asks=asks_from(args, agent))
            return serving.serve_until_signalled(
                lambda stopping: serve_stdio(server, stopping), "stdio")
    where = serving.parse_uri(args.http, "--http", ("http",), "http://127.0.0.1:8765")
    guard = http_front.guard_from_cli(args, where.host, "MCP server")
    limits = http_front.limits_from(args)
    from hivemind_chat_agent.bridges import front_metrics
    metrics = front_metrics.metrics_for("mcp", args.metrics)
    with serving.front_agent(config, "hivemind-chat-mcp", observer=metrics) as agent:
        app = http_app(build_server(agent, asks=asks_from(args, agent)), guard, limits,
                       metrics)
        out.info(f"MCP server (streamable HTTP) on http://{where.host}:{where.port}{MCP_PATH}"
                 + (f"; {len(guard.keys)} API key(s)" if guard.keys
                    else "; no API key: loopback only"))
        return serving.serve_until_signalled(
            lambda stopping: http_front.serve(app, where.host, where.port, limits,
                                              lifespan="on", stopping=stopping), args.http)
