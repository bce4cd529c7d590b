"""The HTTP side: SGLang 0.5.6's routes, answers and API-key rule on ``http.server.ThreadingHTTPServer``."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sglang._atlas_standin import metrics
from sglang._atlas_standin.engine import Engine, Request, chat_prompt_tokens, tokenize
from sglang.version import __version__

logger = logging.getLogger("sglang.srt.entrypoints.http_server")
access = logging.getLogger("uvicorn.access")

NOT_FOUND = {"detail": "Not Found"}


class State:
    """What the routes need: server args, model facts, the engine, the readiness clock."""

    def __init__(self, args: dict[str, Any], engine: Engine, ready_at: float, fail_health_file: str | None):
        self.args = args
        self.engine = engine
        self.ready_at = ready_at
        self.fail_health_file = fail_health_file
        self.served_model_name: str = args["served_model_name"]
        self.shutting_down = False
        self.ready = False  # set once the ready line is logged, at ready_at (main._announce_ready)
        self.group = engine.group  # multi-node rank 0: /health is a 1-token step through every rank
        self.health_timeout = 0

    def healthy(self) -> bool:
        if self.shutting_down or not self.ready:
            return False
        return not (self.fail_health_file and os.path.exists(self.fail_health_file))


class StandinHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], state: State):
        self.state = state
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid the 40 ms delayed-ACK stall
    server_version = "uvicorn"
    sys_version = ""
    server: StandinHTTPServer

    # ---- plumbing -------------------------------------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (BaseHTTPRequestHandler's name)
        pass

    def _access(self, status: int) -> None:
        phrase = HTTPStatus(status).phrase
        access.info('%s:%d - "%s %s HTTP/1.1" %d %s', self.client_address[0], self.client_address[1],
                    self.command, self.path, status, phrase)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._access(status)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload, separators=(",", ":")).encode())

    def _error(self, message: str, status: int = 400, err_type: str = "BadRequestError") -> None:
        self._json(status, {"object": "error", "message": message, "type": err_type, "param": None,
                            "code": status})

    def _body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def _authorized(self, path: str) -> bool:
        key = self.server.state.args.get("api_key")
        if not key or path.startswith("/health") or path.startswith("/metrics"):
            return True
        return self.headers.get("Authorization") == "Bearer " + key

    # ---- dispatch -------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch(GET_ROUTES)

    def do_POST(self) -> None:
        self._dispatch(POST_ROUTES)

    def _dispatch(self, routes: dict[str, Any]) -> None:
        path = self.path.split("?", 1)[0]
        if not self._authorized(path):
            self._json(401, {"error": "Unauthorized"})
            return
        route = routes.get(path)
        if route is None:
            other = POST_ROUTES if routes is GET_ROUTES else GET_ROUTES
            if path in other:
                self._json(405, {"detail": "Method Not Allowed"})
            else:
                self._json(404, NOT_FOUND)
            return
        try:
            route(self)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # ---- native routes --------------------------------------------------------------------------------
    def health(self) -> None:
        state = self.server.state
        ok = state.healthy()
        if ok and state.group is not None:
            ok = state.group.probe(state.health_timeout)
        self._send(200 if ok else 503, b"", "text/plain")

    def model_info(self) -> None:
        args = self.server.state.args
        self._json(200, {"model_path": args["model_path"], "tokenizer_path": args["tokenizer_path"],
                         "is_generation": True, "preferred_sampling_params": args.get("preferred_sampling_params"),
                         "weight_version": args.get("weight_version", "default"),
                         "has_image_understanding": False, "has_audio_understanding": False})

    def get_model_info(self) -> None:
        logger.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                       "Please use '/model_info' instead.")
        self.model_info()

    def server_info(self) -> None:
        engine = self.server.state.engine
        internal = {"last_gen_throughput": engine.gen_throughput(), "max_total_num_tokens":
                    engine.max_total_num_tokens, "#running-req": engine.running, "#queue-req": engine.queued}
        self._json(200, {**self.server.state.args, "max_total_num_tokens": engine.max_total_num_tokens,
                         "internal_states": [internal], "version": __version__})

    def get_server_info(self) -> None:
        logger.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                       "Please use '/server_info' instead.")
        self.server_info()

    def metrics(self) -> None:
        state = self.server.state
        if not state.args.get("enable_metrics"):
            self._json(404, NOT_FOUND)
            return
        self._send(200, metrics.render(state.engine, state.served_model_name).encode(), metrics.CONTENT_TYPE)

    def models(self) -> None:
        name = self.server.state.served_model_name
        card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name,
                "parent": None, "max_model_len": self.server.state.engine.context_len}
        self._json(200, {"object": "list", "data": [card]})

    # ---- OpenAI-compatible generation -----------------------------------------------------------------
    def completions(self) -> None:
        self._openai(chat=False)

    def chat_completions(self) -> None:
        self._openai(chat=True)

    def _openai(self, chat: bool) -> None:
        try:
            body = self._body()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._error(f"Invalid request body, error: {exc}")
            return
        if not isinstance(body, dict):
            self._error("Invalid request body: expected a JSON object")
            return
        req_or_error = self._request(body, chat)
        if isinstance(req_or_error, str):
            self._error(req_or_error)
            return
        stream_opts = body.get("stream_options") or {}
        if body.get("stream"):
            self._stream(req_or_error, chat, bool(stream_opts.get("include_usage")))
        else:
            self._complete(req_or_error, chat)

    def _request(self, body: dict[str, Any], chat: bool) -> Request | str:
        engine = self.server.state.engine
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return "messages: Field required"
            prompt = chat_prompt_tokens(messages)
            max_new = body.get("max_completion_tokens") or body.get("max_tokens")
        else:
            raw = body.get("prompt")
            if raw is None:
                return "prompt: Field required"
            if isinstance(raw, list) and raw and isinstance(raw[0], int):
                prompt = [str(t) for t in raw]
            else:
                prompt = tokenize(raw if isinstance(raw, str) else " ".join(map(str, raw)))
            max_new = body.get("max_tokens", 16)
        if max_new is None:
            max_new = engine.default_max_new_tokens(len(prompt))
        if not isinstance(max_new, int) or max_new < 0:
            return f"max_tokens must be a non-negative integer, got {max_new!r}"
        problem = engine.validate(len(prompt), max_new)
        if problem:
            return problem
        return Request(prompt_tokens=prompt, max_new_tokens=max_new, ignore_eos=bool(body.get("ignore_eos")))

    def _usage(self, req: Request) -> dict[str, Any]:
        return {"prompt_tokens": len(req.prompt_tokens), "total_tokens": len(req.prompt_tokens) + req.generated,
                "completion_tokens": req.generated, "prompt_tokens_details": None, "reasoning_tokens": 0}

    def _complete(self, req: Request, chat: bool) -> None:
        engine = self.server.state.engine
        with engine.admit(req):
            text = "".join(engine.tokens(req)) if req.max_new_tokens else ""
        if req.max_new_tokens == 0:
            req.finish_reason = "length"
        rid = uuid.uuid4().hex
        base = {"index": 0, "logprobs": None, "finish_reason": req.finish_reason, "matched_stop": req.matched_stop}
        if chat:
            choice = {**base, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                          "tool_calls": None}}
            payload = {"id": rid, "object": "chat.completion", "created": int(time.time()),
                       "model": self.server.state.served_model_name, "choices": [choice]}
        else:
            payload = {"id": rid, "object": "text_completion", "created": int(time.time()),
                       "model": self.server.state.served_model_name, "choices": [{**base, "text": text}]}
        payload["usage"] = self._usage(req)
        payload["metadata"] = {"weight_version": self.server.state.args.get("weight_version", "default")}
        self._json(200, payload)

    def _chunk(self, data: str) -> None:
        raw = data.encode()
        self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
        self.wfile.flush()

    def _stream(self, req: Request, chat: bool, include_usage: bool) -> None:
        engine = self.server.state.engine
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self._access(200)
        rid = uuid.uuid4().hex
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.server.state.served_model_name}

        def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> None:
            self._chunk("data: " + json.dumps({**head, "choices": choices, "usage": usage},
                                              separators=(",", ":")) + "\n\n")

        try:
            with engine.admit(req):
                if chat:
                    event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None, "matched_stop": None}])
                for word in engine.tokens(req) if req.max_new_tokens else iter(()):
                    if chat:
                        event([{"index": 0, "delta": {"content": word}, "logprobs": None, "finish_reason": None,
                                "matched_stop": None}])
                    else:
                        event([{"index": 0, "text": word, "logprobs": None, "finish_reason": req.finish_reason,
                                "matched_stop": req.matched_stop}])
            if chat:
                event([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": req.finish_reason or "length",
                        "matched_stop": req.matched_stop}])
            if include_usage:
                event([], self._usage(req))
            self._chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            engine.record_abort()
            self.close_connection = True


GET_ROUTES = {
    "/health": Handler.health,
    "/health_generate": Handler.health,
    "/model_info": Handler.model_info,
    "/get_model_info": Handler.get_model_info,
    "/server_info": Handler.server_info,
    "/get_server_info": Handler.get_server_info,
    "/metrics": Handler.metrics,
    "/v1/models": Handler.models,
}
POST_ROUTES = {
    "/v1/completions": Handler.completions,
    "/v1/chat/completions": Handler.chat_completions,
}


class DummyHealthServer(ThreadingHTTPServer):
    """Node rank >= 1: SGLang's ``launch_dummy_health_check_server`` (``/health``, ``/health_generate``,
    ``/ping`` always 200, empty body; uvicorn at log level warning: no access log). Its ``/metrics`` (with
    ``--enable-metrics``) is not modelled: 404 like any other path."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int]):
        super().__init__(address, DummyHandler)


class DummyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate", "/ping"):
            status, body, ctype = 200, b"", "text/plain"
        else:
            status, body, ctype = 404, json.dumps(NOT_FOUND, separators=(",", ":")).encode(), "application/json"
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
