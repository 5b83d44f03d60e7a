"""The HTTP edge of `hivemind-chat openai`: Starlette routes around bridges/openai_server's
OpenAIBridge, behind bridges/http_front's guard (Host, Origin, Content-Type and keys checked
before the body is read; bounded bodies; a caller who hangs up stops its turn), served by
uvicorn with deadlines and connection caps, and the command line. Nothing here decides anything
a test of the bridge could not see."""
import json
import os
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlparse

from hivemind_chat_agent.bridges import http_front
from hivemind_chat_agent.bridges.openai_server import APIError, OpenAIBridge, first_line, models
from hivemind_chat_agent.core.front_guard import FrontGuard, Keys, Refusal, is_loopback

API_KEY_ENV = "HIVEMIND_CHAT_API_KEY"
TURN_PATH = "/v1/chat/completions"


def create_app(bridge: OpenAIBridge):
    """The bare routes; `guarded_app` puts the guard in front of them."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def error(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def list_models(request):
        return JSONResponse(models())

    async def chat_completions(request):
        headers = _headers(request)
        caller = request.scope.get(http_front.CALLER, "")
        try:
            body = _json_body(await request.body())
            if body.get("stream") is True:
                line, lines = await first_line(bridge.stream(caller, headers, body))
                return StreamingResponse(_prepend(line, lines), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            return JSONResponse(await bridge.complete(caller, headers, body))
        except APIError as e:
            return error(e)

    return Starlette(routes=[Route("/v1/models", list_models, methods=["GET"]),
                             Route(TURN_PATH, chat_completions, methods=["POST"])])


def openai_error(refusal: Refusal) -> Dict[str, Any]:
    """A guard's refusal as an OpenAI error object."""
    kind = "invalid_request_error" if refusal.status in (400, 413, 415) else \
        "authentication_error" if refusal.status == 401 else "permission_error" \
        if refusal.status in (403, 421) else "rate_limit_error"
    return APIError(refusal.status, refusal.message, kind, refusal.code).body()


def guarded_app(bridge: OpenAIBridge, guard: FrontGuard,
                limits: http_front.Limits = http_front.Limits()):
    return http_front.GuardedApp(create_app(bridge), guard, openai_error,
                                 turn_paths=(TURN_PATH,), max_body=limits.max_body)


def _headers(request) -> Dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


def _json_body(raw: bytes) -> Dict[str, Any]:
    """The request's JSON object; APIError 400 for anything else, nesting too deep included."""
    try:
        body = json.loads(raw or b"null")
    except (ValueError, RecursionError):
        raise APIError(400, "the body is not JSON (or nested too deeply)") from None
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object")
    return body


async def _prepend(line, lines):
    if line is not None:
        yield line
    async for rest in lines:
        yield rest


def parse_uri(uri: str) -> Tuple[str, int]:
    """http://HOST:PORT"""
    parsed = urlparse(uri)
    if parsed.scheme != "http" or parsed.port is None or not parsed.hostname:
        raise ValueError(f"--uri must look like http://127.0.0.1:8080, not {uri!r}")
    return parsed.hostname, parsed.port


def check_exposure(host: str, keys) -> None:
    """Anyone who reaches the server talks to the hub as this client: beyond loopback only
    with a key."""
    from hivemind_chat_agent.errors import ConfigurationError
    if not is_loopback(host) and not keys:
        raise ConfigurationError(
            f"refusing to listen on {host} without an API key: anyone reaching it would talk "
            f"to the hub as this client; pass --api-key, --api-key-file or set {API_KEY_ENV}")


def read_keys(given: List[str], files: List[str], env: str = API_KEY_ENV) -> Keys:
    """The API keys from the command line, key files (one per line, # comments) and the
    environment variable; a file that cannot be read is a ConfigurationError."""
    from hivemind_chat_agent.errors import ConfigurationError
    keys = list(given)
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                keys += [line.strip() for line in f
                         if line.strip() and not line.lstrip().startswith("#")]
        except OSError as e:
            raise ConfigurationError(f"cannot read the API key file {path}: "
                                     f"{e.strerror or e}") from None
    if os.environ.get(env, "").strip():
        keys.append(os.environ[env].strip())
    return Keys(keys)


async def serve(bridge: OpenAIBridge, host: str, port: int, guard: Optional[FrontGuard] = None,
                limits: http_front.Limits = http_front.Limits(), started=None) -> None:
    """Serve the API; `guard` defaults to loopback without keys."""
    guard = guard or FrontGuard(host, what="OpenAI API server")
    await http_front.serve(guarded_app(bridge, guard, limits), host, port, limits,
                           started=started)


# ---- the command line (bridges/cli.py hands `hivemind-chat openai` here) ----
def add_key_options(p) -> None:
    """--api-key and --api-key-file, shared by the HTTP fronts."""
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help=f"a key clients must send as a Bearer token (repeatable: each key is "
                        f"its own set of conversations; or set {API_KEY_ENV}); on the command "
                        "line it shows in the process list, prefer --api-key-file")
    p.add_argument("--api-key-file", action="append", default=[], metavar="PATH",
                   help="a file of keys, one per line (repeatable)")


def add_options(p):
    p.prog = "hivemind-chat openai"
    p.description = ("Serve the OpenAI chat completions API (Open WebUI, LibreChat, the openai "
                     "client) answered by the OVOS hub: each request's last message is a turn.")
    p.add_argument("--uri", default="http://127.0.0.1:8080",
                   help="where to listen (default http://127.0.0.1:8080); another address "
                        "than loopback needs an API key")
    add_key_options(p)
    http_front.add_limit_options(p)
    return p


def guard_from_cli(args, host: str, what: str) -> FrontGuard:
    from hivemind_chat_agent.errors import ConfigurationError
    keys = read_keys(args.api_key, args.api_key_file)
    check_exposure(host, keys)
    try:
        return FrontGuard(host, keys, args.allowed_host, args.allowed_origin,
                          turns_per_caller=args.turns_per_caller, what=what)
    except ValueError as e:
        raise ConfigurationError(f"--allowed-origin: {e}") from None


def serve_from_cli(args, out, config: Dict[str, Any]) -> int:
    from hivemind_chat_agent.bridges.cli_config import serve_until_interrupted
    from hivemind_chat_agent.client.agent import HiveMindChatAgent
    from hivemind_chat_agent.errors import ConfigurationError
    try:
        host, port = parse_uri(args.uri)
    except ValueError as e:
        raise ConfigurationError(str(e)) from None
    guard = guard_from_cli(args, host, "OpenAI API server")
    agent = HiveMindChatAgent({**config, "useragent": "hivemind-chat-openai"})
    try:
        out.info(f"OpenAI-compatible API on {args.uri}/v1 (model \"hivemind-chat\")"
                 + (f"; {len(guard.keys)} API key(s)" if guard.keys
                    else "; no API key: loopback only"))
        return serve_until_interrupted(serve(OpenAIBridge(agent), host, port, guard,
                                             http_front.limits_from(args)), args.uri)
    finally:
        agent.shutdown()
