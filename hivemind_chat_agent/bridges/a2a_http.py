"""`hivemind-chat a2a`'s HTTP side: the a2a-sdk's routes around bridges/a2a_server's agent
(the card at its well-known paths, JSON-RPC, A2A 1.0 and 0.3, at the root), behind
bridges/http_front's guard as the OpenAI and MCP fronts are (Host and Origin, a Bearer key off
loopback and each key its own conversations and tasks, bounded bodies and connections, a
caller who hangs up stops its turn at once), and the command line. The card is readable
without a key (it says that the rest needs one). Only the standard library is imported at the
top.
"""
import argparse
import asyncio
from typing import Any, Dict, Optional

from hivemind_chat_agent.bridges import http_front, serving
from hivemind_chat_agent.bridges.a2a_server import (
    CARD_PATH,
    DEFAULT_URI,
    OLD_CARD_PATH,
    REQUEST_TASKS,
    RPC_PATH,
    Caller,
    HubExecutor,
    RequestTurns,
    agent_card,
    build_handler,
)
from hivemind_chat_agent.core.a2a_tasks import TaskBook


def jsonrpc_error(refusal) -> Dict[str, Any]:
    """A guard's refusal as a JSON-RPC error object, what A2A clients read."""
    return {"jsonrpc": "2.0", "id": None,
            "error": {"code": -32001 if refusal.status in (401, 403, 421) else -32000,
                      "message": refusal.message, "data": {"code": refusal.code}}}


def create_app(handler, card):
    """The SDK's routes: the card at both well-known paths, JSON-RPC (1.0 and 0.3) at /."""
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from starlette.applications import Starlette
    routes = create_agent_card_routes(card) + \
        create_agent_card_routes(card, card_url=OLD_CARD_PATH) + \
        create_jsonrpc_routes(handler, RPC_PATH, context_builder=_context_builder(),
                              enable_v0_3_compat=True)
    return Starlette(routes=routes)


def _context_builder():
    """The SDK's call context with the guard's caller as its user (the store's owner)."""
    from a2a.server.routes import DefaultServerCallContextBuilder

    class CallerContextBuilder(DefaultServerCallContextBuilder):
        def build_user(self, request):
            return Caller(request.scope.get(http_front.CALLER, ""))

    return CallerContextBuilder()


class StopOnHangUp:
    """The app, whose request, once cancelled (GuardedApp cancels it when the caller hangs
    up), stops the turns it began at once. The SDK would not: after a streamed request's
    caller left it goes on consuming the task in the background, the hub answering nobody,
    and a cancelled `message/send` waits for its whole task to end before it ends (its
    handler awaits the agent in a `finally`), holding the caller's place that long."""

    def __init__(self, app, executor: HubExecutor):
        self.app, self.executor = app, executor

    async def __call__(self, scope, receive, send) -> None:
        request = RequestTurns()
        token = REQUEST_TASKS.set(request)
        try:        # the app's task copies the context, this request's RequestTurns in it
            app = asyncio.ensure_future(self.app(scope, receive, send))
        finally:
            REQUEST_TASKS.reset(token)
        try:
            await asyncio.shield(app)
        except asyncio.CancelledError:
            request.gone = True
            for task_id in request.task_ids:
                self.executor.stop(task_id)
            app.cancel()
            await asyncio.gather(app, return_exceptions=True)
            raise


def guarded_app(agent, guard, url: str, limits: http_front.Limits = http_front.Limits(),
                book: Optional[TaskBook] = None, metrics=None):
    """The A2A app of `agent` behind `guard`, its card naming `url`, its tasks in `book`."""
    card = agent_card(url, bool(guard.keys))
    # not `book or`: a TaskBook is as long as the tasks it holds, so a new one is falsy
    # (--max-tasks was replaced by the default 1000 so)
    executor = HubExecutor(agent, book if book is not None else TaskBook())
    app = StopOnHangUp(create_app(build_handler(executor, card), card), executor)
    return http_front.GuardedApp(app, guard, jsonrpc_error, turn_paths=(RPC_PATH,),
                                 max_body=limits.max_body,
                                 public_paths=(CARD_PATH, OLD_CARD_PATH), metrics=metrics)


def add_options(p):
    """`hivemind-chat a2a`'s options."""
    p.prog = "hivemind-chat a2a"
    p.description = ("Serve an Agent2Agent (A2A) agent answered by the OVOS hub: a contextId "
                     "is one conversation, a skill's question ends the task in "
                     "input-required, the next message of that task answers it.")
    p.add_argument("--uri", default=DEFAULT_URI,
                   help=f"where to listen (default {DEFAULT_URI}); another address than "
                        "loopback needs an API key")
    p.add_argument("--public-url", default=None, metavar="URL",
                   help="the URL the agent card gives clients (default: --uri; needed when "
                        "listening on 0.0.0.0, or behind a proxy); its host is an allowed "
                        "Host")
    p.add_argument("--max-tasks", type=int, default=1000, metavar="N",
                   help="tasks kept for GetTask and answers (default 1000; the oldest ended "
                        "ones are forgotten first)")
    serving.add_key_options(p)
    http_front.add_limit_options(p)
    return p


def card_url(host: str, uri: str, public_url: Optional[str]) -> str:
    """The URL the card gives clients to send their messages to: `public_url`, else `uri`.
    ConfigurationError when that would be a wildcard bind address (0.0.0.0, ::): clients,
    the ecosystem's plugins among them, post to the card's URL, and 0.0.0.0 reaches no one
    (or, on the same machine, is refused as a foreign Host)."""
    import ipaddress

    from hivemind_chat_agent.errors import ConfigurationError
    if public_url is None:
        try:
            wildcard = ipaddress.ip_address(host).is_unspecified
        except ValueError:
            wildcard = False
        if wildcard:
            raise ConfigurationError(
                f"listening on {host} needs --public-url (e.g. http://THIS-MACHINE:PORT): the "
                "agent card gives clients that URL to send their messages to")
    return (public_url or uri).rstrip("/") + "/"


def public_host(public_url: str) -> str:
    """The host of --public-url (http or https, a port or none, a path or none), or a
    ConfigurationError naming the option."""
    from urllib.parse import urlparse

    from hivemind_chat_agent.errors import ConfigurationError
    try:
        parsed = urlparse(public_url)
        # .port raises for a port that is not a number, or out of range
        host = parsed.hostname if parsed.scheme in ("http", "https") and \
            (parsed.port or 0) >= 0 else None
    except ValueError:
        host = None
    if not host:
        raise ConfigurationError(f"--public-url must look like http://assistant.lan:9999 or "
                                 f"https://assistant.example.org/a2a, not {public_url!r}")
    return host


# the a2a-sdk's switch for its OpenTelemetry spans (read once, when a2a.utils.telemetry loads)
SDK_TRACING = "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"


def quiet_sdk_tracing() -> None:
    """The SDK's tracing off unless SDK_TRACING is set: with opentelemetry installed (the MCP
    SDK and google-api-core bring it) it wraps every call of a request in a span, about 100
    a message, which cost 1.3-2.6 ms of CPU a message with no tracer configured
    (benchmarks/bench_a2a.py's first sentence may take 5 ms more than the agent's own).
    SDK_TRACING=true brings the spans back."""
    import os
    os.environ.setdefault(SDK_TRACING, "false")


def serve_from_cli(args, out, config: Dict[str, Any]) -> int:
    """`hivemind-chat a2a` in bridges/serving's shell: refused before the hub is dialled when
    the address or the keys do not do; a stop signal drains the requests in flight."""
    from hivemind_chat_agent.errors import ConfigurationError
    quiet_sdk_tracing()
    where = serving.parse_uri(args.uri, "--uri", ("http",), DEFAULT_URI)
    url = card_url(where.host, args.uri, args.public_url)
    if args.public_url:     # the name the card gives clients is a Host they may send
        args = argparse.Namespace(**{**vars(args), "allowed_host": [
            *(args.allowed_host or []), public_host(args.public_url)]})
    guard = http_front.guard_from_cli(args, where.host, "A2A server")
    limits = http_front.limits_from(args)
    if args.max_tasks < 1:
        raise ConfigurationError("--max-tasks must be at least 1")
    from hivemind_chat_agent.bridges import front_metrics
    metrics = front_metrics.metrics_for("a2a", args.metrics)
    with serving.front_agent(config, "hivemind-chat-a2a", observer=metrics) as agent:
        app = guarded_app(agent, guard, url, limits, TaskBook(max_tasks=args.max_tasks),
                          metrics)
        out.info(f"A2A agent on {url} (card at {url.rstrip('/')}{CARD_PATH})"
                 + (f"; {len(guard.keys)} API key(s)" if guard.keys
                    else "; no API key: loopback only"))
        return serving.serve_until_signalled(
            lambda stopping: http_front.serve(app, where.host, where.port, limits,
                                              stopping=stopping), args.uri)
