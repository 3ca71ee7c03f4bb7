"""The Tinker HTTP API (``/api/v1/...``) as the official SDK calls it, over a :class:`Service`.

Starlette routes; every mutating call answers at once with a future (``{"request_id": ...}``) that
``retrieve_future`` long-polls. A request the server refuses gets a Tinker error reply
(``{"error", "category"}``) naming the field, never a 500 with a traceback. The wire details, read
from the SDK: docs/tinker.md and :mod:`unirl.serve.wire`.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from unirl.serve.service import RequestError, Service

#: how long retrieve_future holds a poll before ``try_again`` (the SDK's own timeout is 45 s)
LONG_POLL_S = 20.0


def build_app(service: Service, api_key: str | None = None) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def error(message: str, status: int = 400, category: str = "user") -> Any:
        return JSONResponse({"error": message, "category": category, "detail": message}, status_code=status)

    async def body_json(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise RequestError("the body is not JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the body is not a JSON object")
        return body

    def field(body: dict[str, Any], key: str, kind: type | tuple[type, ...] = str, required: bool = True) -> Any:
        value = body.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise RequestError(f"{key}={value!r}: expected a {names}")
        return value

    def future(request_id: str, **extra: Any) -> Any:
        return JSONResponse({"request_id": request_id, **extra})

    def handler(fn: Any) -> Any:
        async def wrapped(request: Request) -> Any:
            try:
                return await fn(request)
            except RequestError as exc:
                return error(str(exc), 400 if exc.category == "user" else 500, exc.category)
        return wrapped

    # ------------------------------------------------------------------ session

    async def client_config(request: Request) -> Any:
        # plain HTTP/1.1 transport (the SDK's pyqwest transport speaks HTTP/2 to its cloud)
        return JSONResponse({"use_pyqwest_transport": False})

    async def empty(request: Request) -> Any:
        return JSONResponse({})

    async def create_session(request: Request) -> Any:
        return JSONResponse({"session_id": service.create_session(), "type": "create_session"})

    async def heartbeat(request: Request) -> Any:
        return JSONResponse({"type": "session_heartbeat"})

    async def telemetry(request: Request) -> Any:
        return JSONResponse({"status": "accepted"})  # accepted and dropped

    async def healthz(request: Request) -> Any:
        return JSONResponse({"status": "ok"})

    async def capabilities(request: Request) -> Any:
        return JSONResponse({"supported_models": [{"model_name": service.model_name, "trainable": True,
                                                   "sampleable": True,
                                                   **({"max_context_length": service.max_length}
                                                      if service.max_length else {})}]})

    # ------------------------------------------------------------------ models and training

    async def create_model(request: Request) -> Any:
        body = await body_json(request)
        lora = body.get("lora_config")
        if lora is not None and not isinstance(lora, dict):
            raise RequestError(f"lora_config={lora!r}: expected an object")
        return future(service.create_model(field(body, "session_id"), field(body, "model_seq_id", int),
                                           body.get("base_model"), lora))

    async def get_info(request: Request) -> Any:
        body = await body_json(request)
        try:
            return JSONResponse(service.info(field(body, "model_id")))
        except RequestError as exc:
            return error(str(exc), 404)

    async def forward_backward(request: Request) -> Any:
        from unirl.serve.wire import read_forward_backward

        if "protobuf" not in request.headers.get("content-type", ""):
            raise RequestError("forward_backward takes a tinker_public.ForwardBackwardRequest "
                               "(Content-Type: application/x-protobuf), as the tinker SDK sends it")
        if request.headers.get("content-encoding", "") not in ("", "identity"):
            raise RequestError(f"Content-Encoding {request.headers['content-encoding']!r}: send the body "
                               f"uncompressed (this server's client/config asks for no compression)")
        try:
            parsed = read_forward_backward(await request.body())
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        return future(service.forward_backward(parsed))

    async def optim_step(request: Request) -> Any:
        body = await body_json(request)
        model_id, seq_id = field(body, "model_id"), field(body, "seq_id", int)
        adam = body.get("adam_params")
        if body.get("optimizer_params") is not None:
            return future(service.refuse_ordered(model_id, seq_id, RequestError(
                f"optimizer_params {body['optimizer_params']}: this server steps AdamW (adam_params) only")))
        if adam is not None and not isinstance(adam, dict):
            return future(service.refuse_ordered(model_id, seq_id, RequestError(
                f"adam_params={adam!r}: expected an object")))
        return future(service.optim_step(model_id, seq_id, adam))

    async def save_weights(request: Request) -> Any:
        body = await body_json(request)
        return future(service.save_weights(field(body, "model_id"), field(body, "seq_id", int),
                                           str(body.get("path") or ""), bool(body.get("overwrite", False))))

    async def load_weights(request: Request) -> Any:
        body = await body_json(request)
        path, optimizer = field(body, "path"), bool(body.get("optimizer", False))
        if body.get("model_id") is None:  # create_training_client_from_state[_with_optimizer]
            return future(service.create_from_state(field(body, "session_id"), field(body, "model_seq_id", int),
                                                    path, optimizer, body.get("base_model")))
        return future(service.load_weights(field(body, "model_id"), field(body, "seq_id", int), path, optimizer))

    async def save_for_sampler(request: Request) -> Any:
        body = await body_json(request)
        model_id, seq_id = field(body, "model_id"), field(body, "seq_id", int)
        name = body.get("path")
        if name is not None and (not isinstance(name, str) or "/" in name or not name):
            return future(service.refuse_ordered(model_id, seq_id, RequestError(
                f"path={name!r}: a sampler weights name must be non-empty without '/'")))
        return future(service.save_for_sampler(model_id, seq_id, name, body.get("sampling_session_seq_id"),
                                               body.get("session_id")))

    async def weights_info(request: Request) -> Any:
        body = await body_json(request)
        from unirl.serve.service import parse_path

        model_id, _, _ = parse_path(field(body, "tinker_path"))
        model = service.models.get(model_id)
        lora = model.lora if model is not None else {}
        return JSONResponse({"base_model": service.model_name, "is_lora": bool(lora),
                             **({"lora_rank": lora["rank"]} if lora else {})})

    # ------------------------------------------------------------------ sampling

    async def create_sampling_session(request: Request) -> Any:
        body = await body_json(request)
        sid = service.create_sampling_session(field(body, "session_id"), field(body, "sampling_session_seq_id", int),
                                              body.get("model_path"), body.get("base_model"))
        return JSONResponse({"sampling_session_id": sid, "type": "create_sampling_session"})

    async def get_sampler(request: Request) -> Any:
        try:
            return JSONResponse(service.sampler(request.path_params["sampler_id"]))
        except RequestError as exc:
            return error(str(exc), 404)

    async def asample(request: Request) -> Any:
        body = await body_json(request)
        rid, sequence_ids = service.sample(body)
        return future(rid, sample_sequence_ids=sequence_ids)

    # ------------------------------------------------------------------ futures

    async def retrieve_future(request: Request) -> Any:
        body = await body_json(request)
        rid = field(body, "request_id")
        fut = service.future(rid)
        if fut is None:
            return error(f"request_id {rid!r} is not a request of this server", 404)
        try:
            kind, payload = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), LONG_POLL_S)
        except TimeoutError:
            return JSONResponse({"type": "try_again", "queue_state": "active"})
        except RequestError as exc:
            return JSONResponse({"error": str(exc), "category": exc.category})
        if kind == "proto":
            return Response(payload, media_type="application/x-protobuf")
        return JSONResponse(payload)

    async def not_found(request: Request) -> Any:
        return error(f"{request.method} {request.url.path} is not an endpoint of this server (docs/tinker.md lists "
                     f"them)", 404)

    v1 = "/api/v1"
    plain = {"client/config": client_config, "client/dynamic_config": empty, "create_session": create_session,
             "session_heartbeat": heartbeat, "telemetry": telemetry, "sessions/{session_id}/finish": empty}
    checked = {"create_model": create_model, "get_info": get_info, "forward_backward": forward_backward,
               "optim_step": optim_step, "save_weights": save_weights, "load_weights": load_weights,
               "save_weights_for_sampler": save_for_sampler, "weights_info": weights_info,
               "create_sampling_session": create_sampling_session, "asample": asample,
               "retrieve_future": retrieve_future}
    routes = [*(Route(f"{v1}/{path}", fn, methods=["POST"]) for path, fn in plain.items()),
              *(Route(f"{v1}/{path}", handler(fn), methods=["POST"]) for path, fn in checked.items()),
              Route(f"{v1}/get_server_capabilities", capabilities, methods=["GET"]),
              Route(f"{v1}/healthz", healthz, methods=["GET"]),
              Route(f"{v1}/samplers/{{sampler_id}}", handler(get_sampler), methods=["GET"]),
              Route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])]
    middleware = []
    if api_key is not None:
        from starlette.middleware import Middleware
        from starlette.middleware.base import BaseHTTPMiddleware

        expected = api_key.encode()

        async def check_key(request: Request, call_next: Any) -> Any:
            given = request.headers.get("x-api-key", "").encode()
            if request.url.path != f"{v1}/healthz" and not hmac.compare_digest(given, expected):
                return error("the X-API-Key header does not hold this server's key (unirl serve --api-key)", 401)
            return await call_next(request)

        middleware.append(Middleware(BaseHTTPMiddleware, dispatch=check_key))
    app = Starlette(routes=routes, middleware=middleware)
    return app
