"""`hivemind-chat openai`, the HTTP server: Starlette routes around bridges/openai_api's
OpenAIBridge (/v1/chat/completions) and bridges/openai_responses' ResponsesAPI (/v1/responses,
through the same bridge), both behind bridges/http_front's guard (Host, Origin, Content-Type
and keys checked before the body is read; bounded bodies; requests in flight counted per
caller; a caller who hangs up stops its turn), served by uvicorn with deadlines and connection
caps, and the command line, in bridges/serving's shell. Nothing here decides anything a test
of the bridge could not see."""
import json
from typing import Any, Dict, Optional

from hivemind_chat_agent.bridges import front_metrics, http_front, serving
from hivemind_chat_agent.bridges.openai_api import APIError, OpenAIBridge, first_line, models
from hivemind_chat_agent.bridges.openai_responses import ResponsesAPI
from hivemind_chat_agent.core.front_guard import FrontGuard, Refusal

TURN_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"


def create_app(bridge: OpenAIBridge):
    """The bare routes; `guarded_app` puts the guard in front of them."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def error(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def list_models(request):
        return JSONResponse(models())

    def turn_route(api):
        """A POST answered by `api` (its `complete`/`create` and `stream`), plain or
        streamed: the same body checks, and an error before the first event as a status."""
        async def answer(request):
            headers = _headers(request)
            caller = request.scope.get(http_front.CALLER, "")
            try:
                body = _json_body(await request.body())
                if body.get("stream") is True:
                    line, lines = await first_line(api.stream(caller, headers, body))
                    return StreamingResponse(_prepend(line, lines),
                                             media_type="text/event-stream",
                                             headers={"Cache-Control": "no-cache"})
                return JSONResponse(await api.answer(caller, headers, body))
            except APIError as e:
                return error(e)
        return answer

    return Starlette(routes=[
        Route("/v1/models", list_models, methods=["GET"]),
        Route(TURN_PATH, turn_route(_Chat(bridge)), methods=["POST"]),
        Route(RESPONSES_PATH, turn_route(_Responses(ResponsesAPI(bridge))), methods=["POST"])])


class _Chat:
    def __init__(self, bridge: OpenAIBridge):
        self.answer, self.stream = bridge.complete, bridge.stream


class _Responses:
    def __init__(self, api: ResponsesAPI):
        self.answer, self.stream = api.create, api.stream


def openai_error(refusal: Refusal) -> Dict[str, Any]:
    """A guard's refusal as an OpenAI error object."""
    kind = "invalid_request_error" if refusal.status in (400, 413, 415) else \
        "authentication_error" if refusal.status == 401 else "permission_error" \
        if refusal.status in (403, 421) else "rate_limit_error"
    return APIError(refusal.status, refusal.message, kind, refusal.code).body()


def guarded_app(bridge: OpenAIBridge, guard: FrontGuard,
                limits: http_front.Limits = http_front.Limits(), metrics=None):
    return http_front.GuardedApp(create_app(bridge), guard, openai_error,
                                 turn_paths=(TURN_PATH, RESPONSES_PATH),
                                 max_body=limits.max_body, metrics=metrics)


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


async def serve(bridge: OpenAIBridge, host: str, port: int, guard: Optional[FrontGuard] = None,
                limits: http_front.Limits = http_front.Limits(), started=None,
                stopping=None, metrics=None) -> None:
    """Serve the API until `stopping` is set (then drain) or it is cancelled; `guard`
    defaults to loopback without keys; `metrics` (bridges/front_metrics) serves /metrics."""
    guard = guard or FrontGuard(host, what="OpenAI API server")
    await http_front.serve(guarded_app(bridge, guard, limits, metrics), host, port, limits,
                           started=started, stopping=stopping)


# ---- the command line (bridges/cli.py hands `hivemind-chat openai` here) ----
def add_options(p):
    p.prog = "hivemind-chat openai"
    p.description = ("Serve the OpenAI chat completions and Responses APIs (Open WebUI, "
                     "LibreChat, n8n, the openai client) answered by the OVOS hub: each "
                     "request's last message is a turn; background tasks are answered here.")
    p.add_argument("--uri", default="http://127.0.0.1:8080",
                   help="where to listen (default http://127.0.0.1:8080); another address "
                        "than loopback needs an API key")
    serving.add_key_options(p)
    http_front.add_limit_options(p)
    return p


def serve_from_cli(args, out, config: Dict[str, Any]) -> int:
    """`hivemind-chat openai` in bridges/serving's shell: refused before the hub is dialled
    when the address or the keys do not do; a stop signal drains the requests in flight."""
    where = serving.parse_uri(args.uri, "--uri", ("http",), "http://127.0.0.1:8080")
    guard = http_front.guard_from_cli(args, where.host, "OpenAI API server")
    limits = http_front.limits_from(args)
    metrics = front_metrics.metrics_for("openai", args.metrics)
    with serving.front_agent(config, "hivemind-chat-openai", observer=metrics) as agent:
        out.info(f"OpenAI-compatible API on {args.uri}/v1 (model \"hivemind-chat\")"
                 + (f"; {len(guard.keys)} API key(s)" if guard.keys
                    else "; no API key: loopback only")
                 + (f"; metrics at {args.uri}/metrics" if metrics else ""))
        bridge = OpenAIBridge(agent)
        return serving.serve_until_signalled(
            lambda stopping: serve(bridge, where.host, where.port, guard, limits,
                                   stopping=stopping, metrics=metrics), args.uri)
