"""``python -m sglang.launch_server``: parse like SGLang, fail like SGLang, serve until SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from sglang._atlas_standin import cli, dist, npu
from sglang._atlas_standin.engine import Engine
from sglang._atlas_standin.knobs import Knobs
from sglang._atlas_standin.server import DummyHealthServer, StandinHTTPServer, State

logger = logging.getLogger("sglang.srt.entrypoints.http_server")
uvicorn = logging.getLogger("uvicorn.error")
ASCEND_PAGE_SIZE = 128


def _configure_logging(level: str) -> None:
    ms = ".%(msecs)03d" if os.environ.get("SGLANG_LOG_MS", "").lower() in {"1", "true", "yes", "y"} else ""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format=f"[%(asctime)s{ms}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", force=True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    for name in ("uvicorn.error", "uvicorn.access"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.propagate = False
        log.setLevel(logging.INFO)


def _fail(exc: cli.StartupError) -> int:
    """An uncaught exception in SGLang's ``__main__``: a traceback on stderr and exit status 1."""
    sys.stderr.write("Traceback (most recent call last):\n"
                     '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
                     '  File "sglang/launch_server.py", line 24, in <module>\n'
                     "    server_args = prepare_server_args(sys.argv[1:])\n"
                     f"{exc.exc_type}: {exc}\n")
    return 1


def _effective(args: dict[str, Any], config: dict[str, Any], knobs: Knobs) -> dict[str, Any]:
    if args.get("attention_backend") == "ascend" and args.get("page_size") != ASCEND_PAGE_SIZE:
        args["page_size"] = ASCEND_PAGE_SIZE
    ctx = args.get("context_length") or config.get("max_position_embeddings") or 4096
    args["context_length"] = int(ctx)
    args["max_running_requests"] = args.get("max_running_requests") or knobs.max_running
    args["weight_version"] = args.get("weight_version") or "default"
    return args


def _eos_token_id(config: dict[str, Any]) -> int:
    eos = config.get("eos_token_id", 2)
    if isinstance(eos, list):
        eos = eos[0] if eos else 2
    return int(eos) if isinstance(eos, int) else 2


def _install_sigterm(server: StandinHTTPServer, state: State) -> None:
    def stop(signum: int, _frame: Any) -> None:
        state.shutting_down = True
        uvicorn.info("Shutting down")
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def _announce_ready(state: State) -> None:
    """Like SGLang: the server reports itself ready, then answers /health with 200 (never the other way
    round: a client that sees 200 finds the line in the log)."""
    time.sleep(max(0.0, state.ready_at - time.monotonic()))
    if not state.shutting_down:
        logger.info("The server is fired up and ready to roll!")
        state.ready = True


def _run_rank(args: dict[str, Any], host: str, port: int, node_rank: int, nnodes: int) -> int:
    """Node rank >= 1: the scheduler child joins the head; then the dummy health server until SIGTERM."""
    proc = dist.spawn_scheduler(host, port, node_rank, nnodes)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        logger.error("Scheduler or DataParallelController %d terminated with %s", proc.pid, proc.wait())
        return 1
    try:
        server = DummyHealthServer((args["host"], int(args["port"])))
    except OSError as exc:
        logger.error("Failed to bind %s:%s: %s", args["host"], args["port"], exc)
        proc.kill()
        return 1
    stopping = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        stopping.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    def watch() -> None:
        code = proc.wait()
        if code != 0 and not stopping.is_set():
            logger.warning("Child process unexpectedly failed with an exit code %d. pid=%d", code, proc.pid)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=watch, daemon=True).start()
    logger.info("Starting dummy health check server at %s:%s", args["host"], server.server_address[1])
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


def _join_head(args: dict[str, Any]) -> tuple[dist.HeadGroup | None, int] | int:
    """Multi-node: rank 0 waits here until every rank has joined (its HTTP port stays closed meanwhile);
    a rank >= 1 runs to its end here (an int: the exit status). Single node: (None, 0)."""
    nnodes, node_rank = int(args.get("nnodes") or 1), int(args.get("node_rank") or 0)
    if nnodes == 1 and node_rank == 0:
        return None, 0
    try:
        dist.check_layout(nnodes, node_rank)
        host, port = dist.parse_addr(args.get("dist_init_addr"), nnodes)
        timeout = dist.health_check_timeout()
    except dist.DistError as exc:
        sys.stderr.write(f"atlas stand-in: {exc}\n")
        return 1
    if node_rank >= 1:
        return _run_rank(args, host, port, node_rank, nnodes)
    group = dist.HeadGroup(host, port, nnodes)
    try:
        group.listen()
    except OSError as exc:
        logger.error("Failed to bind --dist-init-addr %s:%d: %s", host, port, exc)
        return 1
    group.wait_joined()
    group.start_watchdog(float(args["watchdog_timeout"]))
    return group, timeout


def main(argv: list[str]) -> int:
    schema = cli.load_schema()
    parser = cli.build_parser(schema)
    try:
        argv = cli.merge_config_file(argv, cli.store_true_names(schema))
    except cli.StartupError as exc:
        return _fail(exc)
    namespace = parser.parse_args(argv)  # exits 2 on unknown flags or invalid choices, like SGLang
    args = cli.server_args(namespace)
    knobs = Knobs.from_env()
    try:
        config = cli.read_model_config(args["model_path"])
        cli.check_device(args["device"])
    except cli.StartupError as exc:
        return _fail(exc)
    args = _effective(args, config, knobs)
    _configure_logging(args.get("log_level") or "info")
    logger.info("server_args=ServerArgs(%s)", ", ".join(f"{k}={v!r}" for k, v in args.items()))
    if int(args.get("node_rank") or 0) == 0:  # this process is rank 0's scheduler; a rank >= 1's is its child
        try:
            npu.hold()
        except npu.DeviceError as exc:
            npu.report(exc)
            return 1
    joined = _join_head(args)
    if isinstance(joined, int):
        return joined
    group, health_timeout = joined
    engine = Engine(knobs, int(args["max_running_requests"]), args["context_length"], _eos_token_id(config),
                    radix_cache=not args.get("disable_radix_cache"), group=group)
    logger.info("Load weight begin. avail mem=60.00 GB")
    time.sleep(knobs.load_seconds)
    logger.info("Load weight end. type=%s, dtype=%s, avail mem=58.00 GB",
                (config.get("architectures") or ["LlamaForCausalLM"])[0], config.get("torch_dtype", "bfloat16"))
    logger.info("KV Cache is allocated. #tokens: %d", engine.max_total_num_tokens)
    logger.info("max_total_num_tokens=%d, chunked_prefill_size=%s, max_prefill_tokens=%s, max_running_requests=%d, "
                "context_len=%d", engine.max_total_num_tokens, args.get("chunked_prefill_size"),
                args.get("max_prefill_tokens"), engine.max_running, engine.context_len)
    state = State(args, engine, time.monotonic() + knobs.startup_seconds, knobs.fail_health_file)
    state.health_timeout = health_timeout
    try:
        server = StandinHTTPServer((args["host"], int(args["port"])), state)
    except OSError as exc:
        logger.error("Failed to bind %s:%s: %s", args["host"], args["port"], exc)
        return 1
    _install_sigterm(server, state)
    uvicorn.info("Started server process [%d]", os.getpid())
    uvicorn.info("Waiting for application startup.")
    uvicorn.info("Application startup complete.")
    uvicorn.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", args["host"], server.server_address[1])
    threading.Thread(target=_announce_ready, args=(state,), daemon=True).start()
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    uvicorn.info("Finished server process [%d]", os.getpid())
    return 0
