"""Accuracy and overhead of `atlasctl bench` (``make bench-client``; ``python -m atlaslab.benchmarks.accuracy``).

1. Accuracy: the reference server (tests/support/refserver.py, its own process) streams with injected
   TTFT and inter-token delays; the benchmark's median TTFT, ITL and TPOT must lie within 1 ms of them at
   concurrency 1 and 10 (printed per concurrency, with the worst error; the unit tests check correctness
   only, since this figure depends on the machine's load), and its token counts must be exact.
2. Overhead: the highest request rate the client sustains on this machine against a zero-delay server
   (closed loop at rising concurrency; then Poisson arrivals at 80 % of it), with the client's own CPU
   time per request.
3. `vllm bench serve` (when a vLLM venv with it exists, default vllm-bench-venv in the cache directory) against the same
   server in the same run: the ratio of both tools' figures.

Traffic goes to loopback only. Prints a table; ``--json FILE`` keeps the figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from atlasctl.bench import BenchConfig, run_bench
from atlasctl.bench.prompts import customer_service
from atlasctl.paths import cache_dir, repo_root

# Not a fixed path under /tmp: a venv planted there by another user would run as root.
VLLM_VENV = Path(os.environ.get("ATLAS_VLLM_BENCH_VENV") or cache_dir() / "vllm-bench-venv")


def _refserver():
    path = repo_root() / "tests" / "support" / "refserver.py"
    spec = importlib.util.spec_from_file_location("atlas_refserver", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["atlas_refserver"] = module
    spec.loader.exec_module(module)
    return module


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def accuracy(ttft_ms: float, itl_ms: float, out: int, requests: int) -> list[dict]:
    ref = _refserver()
    rows = []
    for concurrency in (1, 10):
        with ref.RefServerProcess(ttft_ms=ttft_ms, itl_ms=itl_ms) as srv:
            r = run_bench(BenchConfig(url=srv.url, concurrency=concurrency, num_requests=requests, output_len=out,
                                      warmup_requests=2))
        expected_in = sum(len(p.text.split()) for p in customer_service(requests + 2)[2:])
        rows.append({
            "concurrency": concurrency, "requests": r.completed, "failed": r.failed,
            "ttft_median_ms": r.metrics["ttft"]["median"], "ttft_error_ms": r.metrics["ttft"]["median"] - ttft_ms,
            "ttft_p99_error_ms": r.metrics["ttft"]["p99"] - ttft_ms,
            "itl_median_ms": r.metrics["itl"]["median"], "itl_error_ms": r.metrics["itl"]["median"] - itl_ms,
            "itl_p99_error_ms": r.metrics["itl"]["p99"] - itl_ms,
            "tpot_error_ms": r.metrics["tpot"]["median"] - itl_ms,
            "output_tokens": r.total_output, "output_tokens_expected": requests * out,
            "input_tokens": r.total_input, "input_tokens_expected": expected_in,
            "worst_median_error_ms": max(abs(r.metrics["ttft"]["median"] - ttft_ms),
                                         abs(r.metrics["itl"]["median"] - itl_ms),
                                         abs(r.metrics["tpot"]["median"] - itl_ms)),
            "counts_exact": r.total_output == requests * out and r.total_input == expected_in,
        })
        rows[-1]["within_1ms"] = rows[-1]["worst_median_error_ms"] < 1.0
    return rows


def overhead(requests: int) -> dict:
    ref = _refserver()
    closed = []
    with ref.RefServerProcess() as srv:
        for concurrency in (8, 32, 64):
            cpu0 = _cpu_s()
            r = run_bench(BenchConfig(url=srv.url, concurrency=concurrency, num_requests=requests, output_len=4,
                                      warmup_requests=concurrency, duration_s=60))
            cpu = _cpu_s() - cpu0
            closed.append({"concurrency": concurrency, "req_per_s": r.request_throughput, "failed": r.failed,
                           "client_cpu_ms_per_request": 1000 * cpu / max(r.completed + concurrency, 1),
                           "ttft_p99_ms": r.metrics["ttft"]["p99"]})
        best = max(closed, key=lambda row: row["req_per_s"])
        poisson = []
        for share in (0.25, 0.5, 0.8):
            target = round(share * best["req_per_s"])
            r = run_bench(BenchConfig(url=srv.url, request_rate=target, concurrency=32, num_requests=requests,
                                      output_len=4, warmup_requests=4, duration_s=60))
            poisson.append({"target_req_per_s": target, "achieved_req_per_s": r.request_throughput,
                            "failed": r.failed, "ttft_median_ms": r.metrics["ttft"]["median"],
                            "ttft_p99_ms": r.metrics["ttft"]["p99"]})
    sustained = [p["target_req_per_s"] for p in poisson if p["achieved_req_per_s"] >= 0.95 * p["target_req_per_s"]]
    return {"closed_loop": closed, "max_req_per_s": best["req_per_s"], "poisson": poisson,
            "max_sustained_poisson_req_per_s": max(sustained, default=None)}


def vllm_comparison(requests: int, in_len: int, out: int, ttft_ms: float, itl_ms: float) -> dict:
    exe = VLLM_VENV / "bin" / "vllm"
    if not exe.exists():
        return {"skipped": f"{exe} not found: no vLLM with `vllm bench serve` on this machine "
                           "(set ATLAS_VLLM_BENCH_VENV to a venv that has it)"}
    from atlaslab.doubles.tiny_model import create_tiny_llama

    ref = _refserver()
    with tempfile.TemporaryDirectory() as tmp, ref.RefServerProcess(ttft_ms=ttft_ms, itl_ms=itl_ms) as srv:
        model_dir = create_tiny_llama(Path(tmp) / "tiny")
        argv = [str(exe), "bench", "serve", "--backend", "openai", "--base-url", srv.url, "--model", "refmodel",
                "--tokenizer", str(model_dir), "--dataset-name", "random", "--random-input-len", str(in_len),
                "--random-output-len", str(out), "--random-range-ratio", "0", "--num-prompts", str(requests),
                "--max-concurrency", "10", "--request-rate", "inf", "--ignore-eos", "--num-warmups", "2",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
                "--save-result", "--result-dir", tmp, "--result-filename", "vllm.json", "--disable-tqdm"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
                   DO_NOT_TRACK="1")
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
        if proc.returncode != 0 or not (Path(tmp) / "vllm.json").exists():
            return {"skipped": f"`vllm bench serve` failed (exit {proc.returncode}): {proc.stderr[-800:]}"}
        theirs = json.loads((Path(tmp) / "vllm.json").read_text())
        vllm_wall = time.monotonic() - started
        ours = run_bench(BenchConfig(url=srv.url, concurrency=10, num_requests=requests, dataset="synthetic",
                                     input_len=in_len, output_len=out, tokenizer=str(model_dir), ignore_eos=True,
                                     warmup_requests=2))
    pairs = {}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("median", "p99", "mean"):
            pairs[f"{metric}_{stat}_ms"] = (ours.metrics[metric][stat], theirs.get(f"{stat}_{metric}_ms"))
    pairs["request_throughput"] = (ours.request_throughput, theirs.get("request_throughput"))
    pairs["output_throughput"] = (ours.output_throughput, theirs.get("output_throughput"))
    pairs["total_output_tokens"] = (ours.total_output, theirs.get("total_output_tokens"))
    pairs["completed"] = (ours.completed, theirs.get("completed"))
    return {
        "injected": {"ttft_ms": ttft_ms, "itl_ms": itl_ms}, "requests": requests, "input_len": in_len,
        "output_len": out, "vllm_wall_s": round(vllm_wall, 1),
        "figures": {k: {"atlasctl": a, "vllm": b, "ratio": (a / b) if a is not None and b else None}
                    for k, (a, b) in pairs.items()},
    }


def _print(report: dict) -> None:
    print("== accuracy (median error vs injected; p99 error) ==")
    for row in report["accuracy"]:
        print(f"c={row['concurrency']:<3} TTFT {row['ttft_median_ms']:.3f} ms (err {row['ttft_error_ms']:+.3f}, "
              f"p99 {row['ttft_p99_error_ms']:+.3f})  ITL {row['itl_median_ms']:.3f} ms "
              f"(err {row['itl_error_ms']:+.3f}, "
              f"p99 {row['itl_p99_error_ms']:+.3f})  TPOT err {row['tpot_error_ms']:+.3f}  tokens out "
              f"{row['output_tokens']}/{row['output_tokens_expected']} in {row['input_tokens']}/"
              f"{row['input_tokens_expected']}  {'OK' if row['within_1ms'] and row['counts_exact'] else 'FAIL'}")
    for row in report["accuracy"]:
        print(f"c={row['concurrency']:<3} median TTFT, ITL and TPOT within 1 ms of the injected delays: "
              f"{'yes' if row['within_1ms'] else 'NO'} (worst {row['worst_median_error_ms']:.3f} ms)")
    if "overhead" in report:
        o = report["overhead"]
        print("== client overhead against a zero-delay server (4 tokens per request) ==")
        for row in o["closed_loop"]:
            print(f"closed loop c={row['concurrency']:<3} {row['req_per_s']:8.1f} req/s  client CPU "
                  f"{row['client_cpu_ms_per_request']:.2f} ms/request  TTFT p99 {row['ttft_p99_ms']:.2f} ms")
        print(f"max closed-loop {o['max_req_per_s']:.1f} req/s")
        for p in o["poisson"]:
            print(f"Poisson target {p['target_req_per_s']:>6} req/s achieved {p['achieved_req_per_s']:8.1f} req/s  "
                  f"TTFT median {p['ttft_median_ms']:.2f} p99 {p['ttft_p99_ms']:.2f} ms")
        print(f"max sustained Poisson rate (>= 95 % achieved): {o['max_sustained_poisson_req_per_s']} req/s")
    v = report.get("vllm")
    if v is not None:
        print("== atlasctl bench vs vllm bench serve (same server, same run) ==")
        if "skipped" in v:
            print("skipped:", v["skipped"])
        else:
            for name, f in v["figures"].items():
                ratio = f"{f['ratio']:.4f}" if f["ratio"] is not None else "-"
                print(f"{name:<22} atlasctl {f['atlasctl']:>10.3f}  vllm {f['vllm'] or 0:>10.3f}  ratio {ratio}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ttft-ms", type=float, default=40.0)
    parser.add_argument("--itl-ms", type=float, default=8.0)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--overhead-requests", type=int, default=3000)
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    report: dict = {"accuracy": accuracy(args.ttft_ms, args.itl_ms, args.output_len, args.requests)}
    if not args.skip_overhead:
        report["overhead"] = overhead(args.overhead_requests)
    if not args.skip_vllm:
        report["vllm"] = vllm_comparison(args.requests, 32, args.output_len, args.ttft_ms, args.itl_ms)
    _print(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    ok = all(row["within_1ms"] and row["counts_exact"] for row in report["accuracy"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
