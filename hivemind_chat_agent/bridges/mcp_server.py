"""`hivemind-chat mcp`: a Model Context Protocol server (the official `mcp` SDK, extra `[mcp]`)
whose one tool, `ask`, puts an utterance to the OVOS hub through `HiveMindChatAgent`, so an LLM
in Claude Desktop, Open WebUI or any MCP client can use the hub's skills.

    ask(utterance, conversation=None) -> the hub's sentences as text, and structured content
        {"answer", "expect_response", "conversation"}: `expect_response` true means a skill
        asked a question and the next `ask` of that conversation answers it.

`conversation` names an OVOS session (kept across calls). Without it: over stdio the process's
own conversation (one client launched it); over HTTP the MCP session's, when the client has one
(`Mcp-Session-Id`, protocols before 2026-07-28), else the server's default conversation: the
2026-07-28 protocol is stateless over HTTP, so clients that share a server should name theirs.
The result names the conversation it ran in. Over stdio by default (what desktop clients launch), streamable HTTP with
`--http` (loopback unless told otherwise). A hub failure is a tool error with the agent's
message, for the model to read.
"""
import asyncio
import uuid
from collections import OrderedDict
from typing import Any, Dict, Optional

from hivemind_chat_agent.errors import HiveMindChatError

TOOL_DESCRIPTION = (
    "Say something to the OVOS voice assistant hub (its skills: time, weather, timers, "
    "alarms, music, smart home, or whatever it runs) and get its spoken answer. When "
    "expect_response is true the assistant asked a question: answer it with another ask in "
    "the same conversation.")


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


async def ask_hub(agent, utterance: str, conversation: str) -> Dict[str, Any]:
    """One turn; the structured result. Raises ValueError for an empty utterance and
    HiveMindChatError for a hub failure."""
    if not utterance or not utterance.strip():
        raise ValueError("utterance must not be empty")
    turn = await agent.abegin([{"role": "user", "content": utterance}],
                              session_id=f"mcp:{conversation}")
    sentences = [sentence async for sentence in turn]
    error = turn.get_exception()
    if error is not None and not sentences:
        raise error
    return {"answer": "\n".join(sentences), "expect_response": bool(turn.expect_response),
            "conversation": conversation}


def build_server(agent, names: Optional[ConversationNames] = None):
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import CallToolResult, TextContent
    from pydantic import BaseModel

    names = names or ConversationNames()
    server = MCPServer(name="hivemind-chat", instructions=TOOL_DESCRIPTION,
                       log_level="WARNING")

    class Answer(BaseModel):
        answer: str
        expect_response: bool
        conversation: str

    @server.tool(description=TOOL_DESCRIPTION)
    async def ask(utterance: str, ctx: Context, conversation: Optional[str] = None) -> Answer:
        name = (conversation or "").strip() or names.default_for(_session_of(ctx))
        try:
            result = await ask_hub(agent, utterance, name)
        except (ValueError, HiveMindChatError) as e:
            raise ToolError(str(e)) from None
        text = result["answer"] or "(the hub had no answer)"
        return CallToolResult(content=[TextContent(type="text", text=text)],
                              structured_content=result)

    return server


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
                   "http://127.0.0.1:8765, path /mcp) instead of stdio")
    return p


def check_args(args) -> None:
    """Over stdio, stdin is the MCP channel: no password prompt may read it."""
    from hivemind_chat_agent.errors import ConfigurationError
    if args.http is None and args.password == "-":
        raise ConfigurationError(
            "--password - would read the MCP channel (stdin): set the identity once with "
            "`hivemind-client set-identity`, or pass the password itself")


def serve_from_cli(args, out, config: Dict[str, Any]) -> int:
    from hivemind_chat_agent import background
    from hivemind_chat_agent.bridges.openai_http import is_loopback, parse_uri
    from hivemind_chat_agent.client.agent import HiveMindChatAgent
    from hivemind_chat_agent.errors import ConfigurationError
    agent = HiveMindChatAgent({**config, "useragent": "hivemind-chat-mcp"})
    try:
        server = build_server(agent)
        background.unblock_signals()
        if args.http is None:
            server.run("stdio")
            return 0
        try:
            host, port = parse_uri(args.http)
        except ValueError as e:
            raise ConfigurationError(str(e).replace("--uri", "--http")) from None
        if not is_loopback(host):
            out.info(f"warning: the MCP server on {host} has no authentication: anyone "
                     "reaching it talks to the hub as this client")
        out.info(f"MCP server (streamable HTTP) on http://{host}:{port}/mcp")
        try:
            asyncio.run(server.run_streamable_http_async(host=host, port=port))
        except KeyboardInterrupt:
            return 0
        return 0
    finally:
        agent.shutdown()
