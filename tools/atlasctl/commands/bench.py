"""`atlasctl bench URL`: a bounded SLO benchmark of an OpenAI-compatible endpoint (vLLM, SGLang).

Exit status: 0 when the run completed and the SLO (if any --slo-* was given) is met, 1 when the SLO is
not met or no request completed, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import urllib.parse
from pathlib import Path

from atlasctl import exitcodes, inventory, tunnel
from atlasctl.bench import SLO, BenchConfig, run_bench
from atlasctl.bench import report as bench_report
from atlasctl.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="SLO benchmark of an OpenAI-compatible endpoint",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="server base URL, e.g. http://10.77.0.11:8000")
    p.add_argument("--model", help="served model name (default: the first of /v1/models)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    load = p.add_argument_group("load (bounded: stops at --num-requests or --duration, whichever comes first)")
    load.add_argument("--concurrency", type=int, default=None,
                      help="concurrent users (closed loop; the deployment guide's 10 is the default without "
                           "--request-rate); "
                           "with --request-rate: the maximum in flight")
    load.add_argument("--request-rate", type=float, default=None,
                      help="requests/s, Poisson arrivals ('inf': all at once)")
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrivals (1 = Poisson)")
    load.add_argument("--num-requests", type=int, default=100, help="measured requests (default 100)")
    load.add_argument("--duration", type=float, default=120.0, help="maximum measured seconds (default 120)")
    load.add_argument("--warmup", type=int, default=2, help="warm-up requests, excluded from figures (default 2)")
    load.add_argument("--timeout", type=float, default=60.0, help="per request seconds (default 60)")
    load.add_argument("--seed", type=int, default=0)
    data = p.add_argument_group("prompts")
    data.add_argument("--dataset", choices=("customer-service", "synthetic"), default="customer-service")
    data.add_argument("--input-len", type=int, default=128, help="synthetic prompt tokens (needs --tokenizer)")
    data.add_argument("--output-len", type=int, default=128, help="max_tokens per request (default 128)")
    data.add_argument("--tokenizer", help="model dir or tokenizer.json, for exact token counts")
    data.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM, SGLang) for exact lengths")
    data.add_argument("--api-key", default=None, help="bearer key (default: $ATLAS_BENCH_API_KEY, $OPENAI_API_KEY)")
    reach = p.add_argument_group("reaching the endpoint")
    reach.add_argument("--ca-file", help="an https URL: the CA its certificate is checked against (the site's CA, "
                                         "atlas_tls_ca_file; default: the system's)")
    reach.add_argument("--through", metavar="HOST",
                       help="through an SSH tunnel to HOST (an engine only its node may reach: the URL as HOST "
                            "sees it), with HOST's SSH settings from -i")
    reach.add_argument("-i", "--inventory", type=Path, help="with --through: the inventory naming HOST")
    slo = p.add_argument_group("SLO gate (exit 1 when not met) and goodput")
    slo.add_argument("--guide-slo", "--article-slo", dest="guide_slo", action="store_true",
                     help="the deployment guide's SLO: E2E latency <= 300 ms at the percentile, >= 30 output tokens/s; "
                          "goodput thresholds e2el:300")
    slo.add_argument("--slo-ttft-ms", type=float)
    slo.add_argument("--slo-tpot-ms", type=float)
    slo.add_argument("--slo-e2el-ms", type=float)
    slo.add_argument("--slo-min-output-tps", type=float, help="aggregate output tokens/s")
    slo.add_argument("--slo-max-failed-pct", type=float, default=0.0)
    slo.add_argument("--slo-min-goodput-pct", type=float, help="share of requests meeting --goodput thresholds")
    slo.add_argument("--slo-max-hbm-pct", type=float, help="peak HBM use (needs --npu-smi)")
    slo.add_argument("--slo-percentile", type=float, default=95.0, help="latency percentile checked (default 95)")
    slo.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS",
                     help="per-request thresholds as vLLM's --goodput: ttft:MS tpot:MS e2el:MS")
    out = p.add_argument_group("telemetry and output")
    out.add_argument("--npu-smi", metavar="CMD",
                     help="command printing `npu-smi info` of the node, e.g. 'ssh root@NODE npu-smi info'")
    out.add_argument("--npu-interval", type=float, default=2.0)
    out.add_argument("--node", help="node name for the kept result (default: the URL's host)")
    out.add_argument("--no-save", action="store_true", help="do not keep the JSON under artifacts/bench/<node>/")
    out.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    out.add_argument("--json-out", type=Path, help="also write the JSON result to this file")
    out.add_argument("--html", type=Path, help="write the self-contained HTML report to this file")
    p.set_defaults(func=run)


def parse_goodput(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        key, _, value = item.partition(":")
        try:
            out[key.strip().lower()] = float(value)
        except ValueError:
            raise UsageError(f"--goodput {item!r} is not KEY:MS", fix="e.g. --goodput ttft:200 e2el:300") from None
        if key.strip().lower() not in ("ttft", "tpot", "e2el"):
            raise UsageError(f"--goodput key {key!r} is not ttft, tpot or e2el")
    return out


def config_from(args: argparse.Namespace) -> BenchConfig:
    goodput = parse_goodput(args.goodput)
    if args.guide_slo:
        goodput.setdefault("e2el", 300.0)
    concurrency = args.concurrency if args.concurrency is not None or args.request_rate is not None else 10
    rate = args.request_rate
    if rate is not None and math.isinf(rate):
        rate = math.inf
    return BenchConfig(
        url=args.url, model=args.model, endpoint=args.endpoint, concurrency=concurrency, request_rate=rate,
        burstiness=args.burstiness, num_requests=args.num_requests, duration_s=args.duration,
        warmup_requests=args.warmup, dataset=args.dataset, input_len=args.input_len, output_len=args.output_len,
        tokenizer=args.tokenizer, ignore_eos=args.ignore_eos, timeout_s=args.timeout, seed=args.seed,
        api_key=args.api_key or os.environ.get("ATLAS_BENCH_API_KEY") or os.environ.get("OPENAI_API_KEY"),
        goodput=goodput, npu_smi=args.npu_smi, npu_interval_s=args.npu_interval, ca_file=args.ca_file)


def slo_from(args: argparse.Namespace) -> SLO | None:
    given = [args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2el_ms, args.slo_min_output_tps,
             args.slo_min_goodput_pct, args.slo_max_hbm_pct]
    if not args.guide_slo and all(v is None for v in given):
        return None
    base = SLO.deployment_guide() if args.guide_slo else SLO()
    for field, value in (("ttft_ms", args.slo_ttft_ms), ("tpot_ms", args.slo_tpot_ms), ("e2el_ms", args.slo_e2el_ms),
                         ("min_output_tps", args.slo_min_output_tps), ("min_goodput_pct", args.slo_min_goodput_pct),
                         ("max_hbm_pct", args.slo_max_hbm_pct)):
        if value is not None:
            setattr(base, field, value)
    base.max_failed_pct = args.slo_max_failed_pct
    base.percentile = args.slo_percentile
    if not 0 <= base.percentile <= 100:
        raise UsageError(f"--slo-percentile {base.percentile} is outside 0..100")
    return base


def _through(args: argparse.Namespace) -> contextlib.AbstractContextManager[str | None]:
    """The URL as this machine reaches it: through an SSH tunnel to ``--through`` (``-i``'s settings for it)."""
    if not args.through:
        return contextlib.nullcontext(None)
    if args.inventory is None:
        raise UsageError("--through needs the inventory that names the host", fix="add -i INVENTORY")
    parts = urllib.parse.urlsplit(args.url)
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(f"--through: {args.url!r} is not an http://host:port URL as {args.through} sees it",
                         fix="e.g. http://10.0.0.11:8000")
    found = inventory.targets(args.inventory, limit=args.through, group="all")
    return tunnel.tunnel(found[0], parts.hostname, parts.port or 80)


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    slo = slo_from(args)
    with _through(args) as local:
        result = run_bench(dataclasses.replace(config, url=local + urllib.parse.urlsplit(args.url).path)
                           if local else config)
    violations = result.meets(slo) if slo else None
    node = args.node or urllib.parse.urlsplit(args.url).hostname or "unknown"
    doc = bench_report.document(result, node, violations)
    if not args.no_save:
        kept = bench_report.save(doc)
        print(f"kept {kept}", file=sys.stderr)
    if args.json_out:
        args.json_out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    if args.html:
        args.html.write_text(bench_report.html_report(doc))
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=True))
    else:
        print(bench_report.console(result, violations))
    if result.completed == 0 or violations:
        return exitcodes.FAILED
    return exitcodes.OK
