"""The HTTP edge of `hivemind-chat openai`: Starlette routes around bridges/openai_server's
OpenAIBridge, uvicorn serving them, and the command line. Nothing here decides anything a test
of the bridge could not see: it reads bodies and headers, writes JSON or SSE, and refuses to
listen beyond loopback without an API key."""
import asyncio
import ipaddress
import json
import os
from typing import Any, Dict, Optional, Tuple
from urllib.parse import urlparse

from hivemind_chat_agent.bridges.openai_server import (MAX_BODY, APIError, OpenAIBridge,
                                                       first_line, models)

API_KEY_ENV = "HIVEMIND_CHAT_API_KEY"


def create_app(bridge: OpenAIBridge):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def error(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def list_models(request):
        try:
            bridge.caller(_headers(request))
        except APIError as e:
            return error(e)
        return JSONResponse(models())

    async def chat_completions(request):
        headers = _headers(request)
        try:
            body = await _json_body(request)
            if body.get("stream") is True:
                line, lines = await first_line(bridge.stream(headers, body))
                return StreamingResponse(_prepend(line, lines), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            return JSONResponse(await bridge.complete(headers, body))
        except APIError as e:
            return error(e)

    return Starlette(routes=[Route("/v1/models", list_models, methods=["GET"]),
                             Route("/v1/chat/completions", chat_completions,
                                   methods=["POST"])])


def _headers(request) -> Dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


async def _json_body(request) -> Dict[str, Any]:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY:
        raise APIError(413, f"the request body is over {MAX_BODY} bytes")
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise APIError(413, f"the request body is over {MAX_BODY} bytes")
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        raise APIError(400, "the body is not JSON") from None
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: Optional[str]) -> None:
    """Anyone who reaches the server talks to the hub as this client: beyond loopback only
    with a key."""
    from hivemind_chat_agent.errors import ConfigurationError
    if not is_loopback(host) and not api_key:
        raise ConfigurationError(
            f"refusing to listen on {host} without an API key: anyone reaching it would talk "
            f"to the hub as this client; pass --api-key or set {API_KEY_ENV}")


async def serve(bridge: OpenAIBridge, host: str, port: int, started=None) -> None:
    import uvicorn
    config = uvicorn.Config(create_app(bridge), host=host, port=port, log_level="warning",
                            lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    if started is not None:
        started(server)
    await server.serve()


# ---- the command line (bridges/cli.py hands `hivemind-chat openai` here) ----
def add_options(p):
    p.prog = "hivemind-chat openai"
    p.description = ("Serve the OpenAI chat completions API (Open WebUI, LibreChat, the openai "
                     "client) answered by the OVOS hub: each request's last message is a turn.")
    p.add_argument("--uri", default="http://127.0.0.1:8080",
                   help="where to listen (default http://127.0.0.1:8080); another address "
                        "than loopback needs an API key")
    p.add_argument("--api-key", default=None,
                   help=f"the key clients must send as a Bearer token (or set {API_KEY_ENV})")
    return p


def serve_from_cli(args, out, config: Dict[str, Any]) -> int:
    from hivemind_chat_agent import background
    from hivemind_chat_agent.client.agent import HiveMindChatAgent
    from hivemind_chat_agent.errors import ConfigurationError
    try:
        host, port = parse_uri(args.uri)
    except ValueError as e:
        raise ConfigurationError(str(e)) from None
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_exposure(host, api_key)
    agent = HiveMindChatAgent({**config, "useragent": "hivemind-chat-openai"})
    try:
        out.info(f"OpenAI-compatible API on {args.uri}/v1 (model \"hivemind-chat\")"
                 + ("" if api_key else "; no API key: loopback only"))
        background.unblock_signals()
        try:
            asyncio.run(serve(OpenAIBridge(agent, api_key), host, port))
        except OSError as e:
            raise ConfigurationError(f"cannot listen on {args.uri}: {e.strerror or e}") from None
        except KeyboardInterrupt:
            return 0
        return 0
    finally:
        agent.shutdown()
