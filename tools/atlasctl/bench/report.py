"""Bench output: the console table, the kept JSON (artifacts/bench/<node>/), the self-contained HTML report.

Kept results: ``artifacts/bench/<node>/<UTC stamp>.json`` (``BenchResult.to_dict()`` plus ``node``,
``finished_at``). ``latest(node)`` returns the newest; `atlasctl health` shows it in its LAST BENCH column.
"""

from __future__ import annotations

import datetime as dt
import html
import json
from pathlib import Path

import jinja2
from markupsafe import Markup

from atlasctl import outputs
from atlasctl.bench import stats
from atlasctl.bench.core import DEFINITIONS, BenchResult
from atlasctl.paths import state_dir, suite_root

TITLES = {"ttft": "Time to first token (ms)", "tpot": "Time per output token (ms)",
          "itl": "Inter-token latency (ms)", "e2el": "End-to-end latency (ms)"}


def bench_dir() -> Path:
    return state_dir() / "bench"


# --- console ---------------------------------------------------------------------------------------------


def console(result: BenchResult, violations: list[str] | None = None) -> str:
    c = result.config
    load = (f"concurrency {c['concurrency']}" if c["request_rate"] is None
            else f"rate {c['request_rate']:g} req/s (burstiness {c['burstiness']:g}), max concurrency "
                 f"{c['concurrency'] or 'unbounded'}")
    rows = [("Endpoint", f"{c['url']} /v1/{'chat/' if c['endpoint'] == 'chat' else ''}completions, "
                         f"model {result.model}"),
            ("Load", load),
            ("Successful requests", f"{result.completed}"),
            ("Failed requests", f"{result.failed}" + (f" (+{result.not_sent} not sent)" if result.not_sent else "")),
            ("Benchmark duration (s)", f"{result.duration_s:.2f}"),
            ("Total input tokens", f"{result.total_input}"),
            ("Total generated tokens", f"{result.total_output} ({result.token_source})"),
            ("Request throughput (req/s)", f"{result.request_throughput:.2f}"),
            ("Output token throughput (tok/s)", f"{result.output_throughput:.2f}"),
            ("Peak output token throughput (tok/s)", f"{result.max_output_tokens_per_s:.2f}"),
            ("Total token throughput (tok/s)", f"{result.total_token_throughput:.2f}")]
    if result.request_goodput is not None:
        rows.append(("Request goodput (req/s)", f"{result.request_goodput:.2f} ({result.good_pct:.1f} %)"))
    width = max(len(k) for k, _ in rows) + 2
    lines = ["{:=^72}".format(" Serving Benchmark Result ")]
    lines += [f"{k + ':':<{width}}{v}" for k, v in rows]
    keys = ["mean", "median", "p90", "p95", "p99"]
    lines.append(f"{'':<10}" + "".join(f"{k:>12}" for k in ["n", *keys]))
    for metric in ("ttft", "tpot", "itl", "e2el"):
        s = result.metrics[metric]
        lines.append(f"{metric.upper() + ' ms':<10}{s['n']:>12}" + "".join(f"{s[k]:>12.2f}" for k in keys))
    if result.telemetry:
        t = result.telemetry
        if t["error"]:
            lines.append(f"NPU telemetry: {t['error']}")
        else:
            lines.append(f"NPU ({t['samples']} samples): AICore util mean {t['util_pct_mean']} % max "
                         f"{t['util_pct_max']} %, peak HBM {t['hbm_pct_max']} % ({t['hbm_used_mb_max']} MB)")
    if result.errors:
        lines.append("errors: " + "; ".join(result.errors[:3]))
    if violations is not None:
        lines.append("SLO: met" if not violations else "SLO NOT MET: " + "; ".join(violations))
    lines.append("=" * 72)
    return "\n".join(lines)


# --- kept JSON --------------------------------------------------------------------------------------------


def document(result: BenchResult, node: str, violations: list[str] | None = None,
             finished_at: str | None = None) -> dict:
    doc = result.to_dict()
    doc["node"] = node
    doc["finished_at"] = finished_at or dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc["slo_violations"] = violations
    return doc


def save(doc: dict, root: Path | None = None) -> Path:
    folder = (root or bench_dir()) / _safe(doc["node"])
    folder.mkdir(parents=True, exist_ok=True)
    stamp = doc["finished_at"].replace(":", "").replace("-", "")
    n = len(list(folder.glob(f"{stamp}-*.json")))
    path = folder / f"{stamp}-{n:03d}.json"  # sorts by time, several runs in one second kept
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


def latest(node: str, root: Path | None = None) -> dict | None:
    folder = (root or bench_dir()) / _safe(node)
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    for path in reversed(files):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return None


def brief(doc: dict | None) -> str:
    """One cell for the fleet table: 'TTFT 41ms E2E 161ms 96 tok/s c10 2025-01-02'."""
    if not doc:
        return "-"
    m = doc["metrics"]
    load = f"c{doc['config']['concurrency']}" if doc["config"]["request_rate"] is None else \
        f"r{doc['config']['request_rate']:g}"
    mark = "" if not doc.get("slo_violations") else " SLO!"
    return (f"TTFT {m['ttft']['median']:.0f}ms E2E {m['e2el']['median']:.0f}ms "
            f"{doc['output_throughput']:.0f}tok/s {load} {doc['finished_at'][:10]}{mark}")


def _safe(node: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in node) or "unknown"


# --- HTML -----------------------------------------------------------------------------------------------


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def svg_histogram(hist: dict, title: str, marks: dict[str, float], width: int = 460, height: int = 220) -> Markup:
    """Bars of a histogram with the median and p99 marked; inline SVG, no script."""
    pad_l, pad_b, pad_t = 46, 34, 22
    plot_w, plot_h = width - pad_l - 10, height - pad_b - pad_t
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{width / 2}" y="15" text-anchor="middle" class="t">{html.escape(title)}</text>']
    counts, edges = hist.get("counts") or [], hist.get("edges") or []
    if not counts:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no samples</text></svg>')
        return Markup("".join(parts))
    top = max(counts)
    lo, hi = edges[0], edges[-1]
    span = (hi - lo) or 1.0
    bar_w = plot_w / len(counts)
    for i, n in enumerate(counts):
        h = plot_h * n / top
        tip = f"{_fmt(edges[i])}–{_fmt(edges[i + 1])} ms: {n}"
        parts.append(f'<rect x="{pad_l + i * bar_w:.1f}" y="{pad_t + plot_h - h:.1f}" width="{max(bar_w - 1, 1):.1f}" '
                     f'height="{h:.1f}" class="bar"><title>{tip}</title></rect>')
    for name, value in marks.items():
        x = pad_l + plot_w * (value - lo) / span
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{pad_t}" y2="{pad_t + plot_h}" class="mark"/>'
                     f'<text x="{x + 2:.1f}" y="{pad_t + 10}" class="m">{name} {_fmt(value)}</text>')
    parts += _axes(pad_l, pad_t, plot_w, plot_h, (_fmt(lo), _fmt(hi)), ("0", str(top)), "ms", "requests")
    parts.append("</svg>")
    return Markup("".join(parts))


def svg_series(points: list[tuple[float, float]], title: str, y_label: str, width: int = 940,
               height: int = 240) -> Markup:
    """A line over time (x in seconds from the measured start)."""
    pad_l, pad_b, pad_t = 56, 34, 22
    plot_w, plot_h = width - pad_l - 14, height - pad_b - pad_t
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{width / 2}" y="15" text-anchor="middle" class="t">{html.escape(title)}</text>']
    if not points:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no samples</text></svg>')
        return Markup("".join(parts))
    xmax = max(p[0] for p in points) or 1.0
    ymax = max(p[1] for p in points) or 1.0
    coords = " ".join(f"{pad_l + plot_w * x / xmax:.1f},{pad_t + plot_h * (1 - y / ymax):.1f}" for x, y in points)
    parts.append(f'<polyline points="{coords}" class="line"/>')
    for x, y in points:
        parts.append(f'<circle cx="{pad_l + plot_w * x / xmax:.1f}" cy="{pad_t + plot_h * (1 - y / ymax):.1f}" r="2.5" '
                     f'class="dot"><title>t={_fmt(x)} s: {_fmt(y)}</title></circle>')
    parts += _axes(pad_l, pad_t, plot_w, plot_h, ("0", _fmt(xmax)), ("0", _fmt(ymax)), "s", y_label)
    parts.append("</svg>")
    return Markup("".join(parts))


def _axes(x0: float, y0: float, w: float, h: float, xr: tuple[str, str], yr: tuple[str, str], xl: str,
          yl: str) -> list[str]:
    return [f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" class="ax"/>',
            f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" class="ax"/>',
            f'<text x="{x0}" y="{y0 + h + 14}" text-anchor="middle">{xr[0]}</text>',
            f'<text x="{x0 + w}" y="{y0 + h + 14}" text-anchor="end">{xr[1]}</text>',
            f'<text x="{x0 + w / 2}" y="{y0 + h + 28}" text-anchor="middle">{html.escape(xl)}</text>',
            f'<text x="{x0 - 4}" y="{y0 + h}" text-anchor="end">{yr[0]}</text>',
            f'<text x="{x0 - 4}" y="{y0 + 8}" text-anchor="end">{yr[1]}</text>',
            f'<text x="12" y="{y0 + h / 2}" transform="rotate(-90 12 {y0 + h / 2})" '
            f'text-anchor="middle">{html.escape(yl)}</text>']


def _visible(value: object) -> object:
    """Each ``{{ }}`` of a page: a string's control characters made visible (a bidi override reorders a page as it
    does a terminal), then HTML-escaped by autoescape; markup the suite built (the SVG charts) as it is."""
    return outputs.safe_lines(value) if isinstance(value, str) and not isinstance(value, Markup) else value


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(suite_root() / "templates")), finalize=_visible,
                              autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def html_report(doc: dict) -> str:
    """The bench report as one self-contained HTML page (inline CSS and SVG, no script)."""
    metrics = doc["metrics"]
    charts = [svg_histogram(doc["histograms"][k], TITLES[k],
                            {"p50": metrics[k]["median"], "p99": metrics[k]["p99"]} if metrics[k]["n"] else {})
              for k in ("ttft", "e2el", "itl", "tpot")]
    timeline = doc["timeline"]
    throughput = svg_series([(b["t"] + 0.5, b["output_tokens"]) for b in timeline],
                            "Output tokens per second over the run", "tokens/s")
    in_flight = svg_series([(b["t"] + 0.5, b["in_flight"]) for b in timeline],
                           "Requests in flight per second", "requests")
    npu = None
    if doc.get("telemetry_samples"):
        samples = doc["telemetry_samples"]
        npu = [svg_series([(s["t"], s["util_pct"] or 0) for s in samples], "NPU AICore utilisation", "%"),
               svg_series([(s["t"], s["hbm_pct"] or 0) for s in samples], "HBM use", "%")]
    keys = ["mean", "median", "p90", "p95", "p99", "std", "min", "max"]
    return _env().get_template("bench_report.html.j2").render(
        doc=doc, keys=keys, charts=charts, throughput=throughput, in_flight=in_flight, npu=npu,
        definitions=DEFINITIONS, metric_names=TITLES, pct_key=stats.pct_key)


def health_html(rows: list[dict], columns: list[tuple[str, str]], ok: bool, generated: str | None) -> str:
    return _env().get_template("health_report.html.j2").render(
        rows=rows, columns=columns, ok=ok, generated=generated,
        bad=[bool(r.get("problem")) or r.get("service") != "active" for r in rows],
        problems=[r for r in rows if r.get("problem")])
