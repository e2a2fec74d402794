"""``jointrl report RUN_DIR``: one self-contained HTML page about a run.

The page (default ``RUN_DIR/report.html``) needs no network and no JavaScript: every chart
is inline SVG drawn here from ``metrics.jsonl``:

* reward per domain: train ``reward/<d>/mean`` (solid) and held-out ``eval/reward/<d>/mean`` (dashed);
* KL to the reference (``kl/mean``) and policy entropy (``entropy/mean``);
* response length per domain: ``rollout/<d>/response_len/mean`` (and its ``eval/`` twin, dashed);
* time per step, stacked: ``timing/{rollout,reward,learner,sync}_s``, other (``timing/step_s``
  minus those) and the held-out evaluation ``timing/eval_s`` (it runs after the step).

A mixture-of-experts run (its records hold ``moe/layer_<i>/entropy``) gets an "Experts" section
(``moe_charts``): per layer, the entropy of the expert load (dashed: ``moe/entropy_balanced``, the
entropy of a perfectly even load) and its max/mean ratio (1 when even); ``moe/routing_disagreement``
(and ``/<domain>``) where logged; and, where the records hold ``moe/layer_<i>/tokens_expert_<e>``,
each expert's share of its layer's tokens. A dense run has no such section.

Then the best and the worst rollouts per domain of the last train step and of the last
evaluation in ``rollouts.jsonl``, and ``recipe.resolved.yaml``. Everything taken from the
run is HTML-escaped. A chart whose keys are missing says "no data"; a run still in progress
(no ``DONE``) works. Each chart is an ``<svg class="chart" data-series="N">`` holding one
``<path class="series">`` per line series, or one ``<g class="series">`` of ``<rect>`` per
stacked-bar series. More than ``MAX_BARS`` steps are averaged into ``MAX_BARS`` bars.

``write_seed_report`` draws several runs of one recipe on one page (a seed sweep, ``bench/seeds.py``):
the held-out curve per domain, one line per run.
"""

from __future__ import annotations

import argparse
import datetime
import html
import math
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.driver.logger import read_step_records

__all__ = [
    "write_report",
    "render_report",
    "moe_charts",
    "write_seed_report",
    "render_seed_report",
    "read_metrics",
    "last_rollouts",
    "add_parser",
    "ReportError",
]

DOMAIN_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)
KL_COLOR = "#6a3d9a"
BALANCED_COLOR = "#999999"  # the dashed "even load" reference line of the expert charts
ENTROPY_COLOR = "#b15928"
TIMING_PHASES = (  # (label, key or None for "other", color)
    ("rollout", "timing/rollout_s", "#4e79a7"),
    ("reward", "timing/reward_s", "#f28e2b"),
    ("learner", "timing/learner_s", "#e15759"),
    ("sync", "timing/sync_s", "#76b7b2"),
    ("other", None, "#bab0ac"),
    ("eval", "timing/eval_s", "#59a14f"),
)
ROLLOUTS_SHOWN = 3  # best and worst rollouts per domain and split
MAX_TEXT = 6000  # characters of a prompt or response shown (the rest is cut, with a note)
MAX_BARS = 200  # more steps than this are averaged into this many bars
MAX_MARKERS = 100  # series with more points than this are drawn without point markers

W, H = 560, 250
ML, MR, MT, MB = 58, 14, 12, 34  # margins: left, right, top, bottom


class ReportError(Exception):
    """The run dir cannot be reported on; the message is for the user as is."""


# ---------------------------------------------------------------------------- reading


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` by step (the last record of a repeated step wins).

    Lines that do not parse (a line being written right now) are skipped.
    """
    by_step = {rec["step"]: rec for rec in read_step_records(path)}
    return [by_step[s] for s in sorted(by_step)]


def last_rollouts(path: Path) -> dict[str, tuple[int, list[dict[str, Any]]]]:
    """``{split: (step, rows)}``: the rows of the last step of each split in ``rollouts.jsonl``
    (read as a stream: only one step's rows per split are held)."""
    last: dict[str, tuple[int, list[dict[str, Any]]]] = {}
    for r in read_step_records(path):
        split = str(r.get("split", ""))
        cur = last.get(split)
        if cur is None or r["step"] > cur[0]:
            last[split] = (r["step"], [r])
        elif r["step"] == cur[0]:
            cur[1].append(r)
    return last


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _domains(records: list[dict[str, Any]], rx: str) -> list[str]:
    pat = re.compile(rx)
    return sorted({m.group(1) for r in records for k in r if (m := pat.match(k))})


# ---------------------------------------------------------------------------- SVG charts


@dataclass
class Series:
    name: str
    points: list[tuple[float, float | None]]  # (step, value); None breaks the line
    color: str
    dashed: bool = False


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0, 1.0]
    if hi - lo < 1e-12:
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t < hi + step * 0.999:
        ticks.append(round(t, 12))
        t += step
    return ticks


def tick_labels(ticks: list[float]) -> list[str]:
    """Axis labels for ``ticks`` (evenly spaced): as many decimals as the spacing needs, so that each label
    reads its own tick's value (an entropy of 10.371-10.373 gets 10.371, 10.372..., not five times 10.4).
    Spacings under 1e-4 on values near 0 use scientific notation; 1000 and up get thousands separators."""
    if len(ticks) < 2:
        return [f"{t:.3g}" for t in ticks]
    step = min(abs(b - a) for a, b in zip(ticks, ticks[1:])) or 1.0
    top = max(abs(t) for t in ticks)
    if step < 1e-4 and top < 1e-2:
        for sig in range(0, 13):
            labels = [f"{t:.{sig}e}" if t else "0" for t in ticks]
            if len(set(labels)) == len(labels):
                return labels
    d = 0
    while d < 12 and any(abs(round(t, d) - t) > step * 1e-6 for t in ticks):
        d += 1
    sep = "," if top >= 1000 else ""
    return ["0" if abs(t) < step * 1e-9 else f"{t:{sep}.{d}f}" for t in ticks]


def _frame(xs: list[float], ys: list[float], y_zero: bool) -> tuple[Any, Any, list[str]]:
    """Scales and the axes/grid SVG for data ranges ``xs`` / ``ys``."""
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    ylo, yhi = min(ys), max(ys)
    if y_zero:
        ylo = min(ylo, 0.0)
    yt = _nice_ticks(ylo, yhi)
    y0, y1 = yt[0], yt[-1]
    pw, ph = W - ML - MR, H - MT - MB

    def sx(x: float) -> float:
        return ML + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return MT + ph - (y - y0) / (y1 - y0) * ph

    parts = []
    for t, label in zip(yt, tick_labels(yt)):
        y = sy(t)
        parts.append(f'<line class="grid" x1="{ML}" y1="{y:.1f}" x2="{W - MR}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{ML - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(label)}</text>')
    xt = [t for t in _nice_ticks(x0, x1, 6) if x0 <= t <= x1 and float(t).is_integer()]
    for t in xt:
        x = sx(t)
        parts.append(f'<line class="tickmark" x1="{x:.1f}" y1="{MT + ph}" x2="{x:.1f}" y2="{MT + ph + 4}"/>')
        parts.append(f'<text class="tick" x="{x:.1f}" y="{MT + ph + 16}" text-anchor="middle">{int(t)}</text>')
    parts.append(f'<line class="axis" x1="{ML}" y1="{MT + ph}" x2="{W - MR}" y2="{MT + ph}"/>')
    parts.append(f'<line class="axis" x1="{ML}" y1="{MT}" x2="{ML}" y2="{MT + ph}"/>')
    parts.append(f'<text class="label" x="{ML + pw / 2:.1f}" y="{H - 4}" text-anchor="middle">step</text>')
    return sx, sy, parts


def _no_data(title: str, why: str) -> str:
    return (
        f'<svg class="chart" data-series="0" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="{_e(title)}: no data"><rect class="bg" x="0" y="0" width="{W}" height="{H}"/>'
        f'<text class="nodata" x="{W / 2}" y="{H / 2 - 6}" text-anchor="middle">no data</text>'
        f'<text class="tick" x="{W / 2}" y="{H / 2 + 14}" text-anchor="middle">{_e(why)}</text></svg>'
    )


def line_chart(title: str, series: list[Series], why_empty: str, y_zero: bool = False) -> str:
    """An SVG line chart: one ``<path class="series">`` per series that has at least one point."""
    series = [s for s in series if any(v is not None for _, v in s.points)]
    if not series:
        return _no_data(title, why_empty)
    xs = [x for s in series for x, v in s.points if v is not None]
    ys = [v for s in series for _, v in s.points if v is not None]
    sx, sy, parts = _frame(xs, ys, y_zero)
    for s in series:
        d, pen = [], "M"
        for x, v in s.points:
            if v is None:
                pen = "M"
                continue
            d.append(f"{pen}{sx(x):.1f},{sy(v):.1f}")
            pen = "L"
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        parts.append(
            f'<path class="series" data-name="{_e(s.name)}" d="{" ".join(d)}" fill="none" '
            f'stroke="{s.color}" stroke-width="2.5" stroke-linejoin="round"{dash}/>'
        )
        pts = [(x, v) for x, v in s.points if v is not None]
        if len(pts) <= MAX_MARKERS:
            for x, v in pts:
                parts.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(v):.1f}" r="{3.5 if s.dashed or len(pts) < 3 else 2.5}" '
                    f'fill="{s.color}"><title>{_e(s.name)} step {x:g}: {v:.4g}</title></circle>'
                )
    return (
        f'<svg class="chart" data-series="{len(series)}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" aria-label="{_e(title)}"><rect class="bg" x="0" y="0" width="{W}" height="{H}"/>'
        + "".join(parts)
        + "</svg>"
    )


def stacked_bars(title: str, steps: list[int], stacks: list[tuple[str, str, list[float]]], why_empty: str) -> str:
    """An SVG stacked bar chart: per step, one ``<rect>`` per stack; one ``<g class="series">`` per
    stack with any positive value. ``stacks``: (name, color, values aligned with ``steps``)."""
    stacks = [s for s in stacks if any(v > 0 for v in s[2])]
    if not steps or not stacks:
        return _no_data(title, why_empty)
    if len(steps) > MAX_BARS:  # average consecutive steps into MAX_BARS bars
        n = len(steps)
        bounds = [(i * n // MAX_BARS, (i + 1) * n // MAX_BARS) for i in range(MAX_BARS)]
        steps = [steps[a] for a, _ in bounds]
        stacks = [(name, c, [sum(vals[a:b]) / (b - a) for a, b in bounds]) for name, c, vals in stacks]
    totals = [sum(s[2][i] for s in stacks) for i in range(len(steps))]
    gap = min((b - a for a, b in zip(steps, steps[1:])), default=1) or 1
    lo, hi = steps[0] - gap / 2, steps[-1] + gap / 2
    sx, sy, parts = _frame([lo, hi], [0.0, max(totals)], True)
    bw = gap / (hi - lo) * (W - ML - MR) * 0.84
    base = [0.0] * len(steps)
    for name, color, vals in stacks:
        g = [f'<g class="series" data-name="{_e(name)}" fill="{color}">']
        for i, st in enumerate(steps):
            if vals[i] <= 0:
                continue
            y_top, y_bot = sy(base[i] + vals[i]), sy(base[i])
            base[i] += vals[i]
            g.append(
                f'<rect x="{sx(st) - bw / 2:.1f}" y="{y_top:.1f}" width="{max(bw, 0.5):.1f}" '
                f'height="{max(y_bot - y_top, 0.0):.1f}"><title>step {st}: {_e(name)} {vals[i]:.2f} s</title></rect>'
            )
        g.append("</g>")
        parts.append("".join(g))
    parts.append(
        f'<text class="label" x="12" y="{MT + (H - MT - MB) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {MT + (H - MT - MB) / 2:.0f})">seconds</text>'
    )
    return (
        f'<svg class="chart" data-series="{len(stacks)}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" aria-label="{_e(title)}"><rect class="bg" x="0" y="0" width="{W}" height="{H}"/>'
        + "".join(parts)
        + "</svg>"
    )


def _legend(items: Iterable[tuple[str, str, bool]]) -> str:
    spans = [
        f'<span class="key"><i style="border-top:3px {"dashed" if dashed else "solid"} {color}"></i>{_e(name)}</span>'
        for name, color, dashed in items
    ]
    return f'<div class="legend">{"".join(spans)}</div>' if spans else ""


def _series(records: list[dict[str, Any]], key: str) -> list[tuple[float, float | None]]:
    return [(r["step"], _num(r.get(key))) for r in records if key in r]


# ---------------------------------------------------------------------------- the charts of a run


def charts(records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(title, svg, legend html) of every chart, in page order."""
    train_d = _domains(records, r"^reward/([^/]+)/mean$")
    eval_d = _domains(records, r"^eval/reward/([^/]+)/mean$")
    doms = sorted(set(train_d) | set(eval_d))
    color = {d: DOMAIN_COLORS[i % len(DOMAIN_COLORS)] for i, d in enumerate(doms)}
    out = [
        _per_domain_chart(
            records,
            doms,
            color,
            "Reward per domain",
            "reward/{}/mean",
            "eval/reward/{}/mean",
            "metrics.jsonl has no reward/<domain>/mean or eval/reward/<domain>/mean",
        )
    ]
    out += [
        _scalar_chart(records, title, key, c)
        for title, key, c in (
            ("KL to the reference (kl/mean)", "kl/mean", KL_COLOR),
            ("Entropy (entropy/mean)", "entropy/mean", ENTROPY_COLOR),
        )
    ]
    len_d = _domains(records, r"^(?:eval/)?rollout/([^/]+)/response_len/mean$")
    for d in len_d:  # a domain with lengths but no reward yet keeps the colors of the others
        color.setdefault(d, DOMAIN_COLORS[len(color) % len(DOMAIN_COLORS)])
    out.append(
        _per_domain_chart(
            records,
            sorted(set(doms) | set(len_d)),
            color,
            "Response length per domain (policy tokens)",
            "rollout/{}/response_len/mean",
            "eval/rollout/{}/response_len/mean",
            "metrics.jsonl has no rollout/<domain>/response_len/mean",
        )
    )
    out.append(_timing_chart(records))
    return out


def _per_domain_chart(
    records: list[dict[str, Any]],
    doms: list[str],
    color: dict[str, str],
    title: str,
    train_fmt: str,
    eval_fmt: str,
    why: str,
) -> tuple[str, str, str]:
    """A line per domain for train (solid) and eval (dashed); ``why`` is shown when there is no data."""
    ss = []
    for d in doms:
        ss.append(Series(f"{d} (train)", _series(records, train_fmt.format(d)), color[d]))
        ss.append(Series(f"{d} (eval)", _series(records, eval_fmt.format(d)), color[d], dashed=True))
    ss = [s for s in ss if any(v is not None for _, v in s.points)]
    return title, line_chart(title, ss, why, True), _legend((s.name, s.color, s.dashed) for s in ss)


def _scalar_chart(records: list[dict[str, Any]], title: str, key: str, c: str) -> tuple[str, str, str]:
    """One metric's line."""
    s = Series(key, _series(records, key), c)
    has = any(v is not None for _, v in s.points)
    return title, line_chart(title, [s], f"metrics.jsonl has no {key}"), _legend([(key, c, False)] if has else [])


def _timing_chart(records: list[dict[str, Any]]) -> tuple[str, str, str]:
    """Time per step, stacked by phase; "other" is the step time not in the named phases."""
    timed = [r for r in records if any(_num(r.get(k)) for _, k, _ in TIMING_PHASES if k)]
    steps = [r["step"] for r in timed]
    stacks = []
    for name, key, c in TIMING_PHASES:
        vals = []
        for r in timed:
            if key is None:
                total = _num(r.get("timing/step_s"))
                parts = sum(_num(r.get(k)) or 0.0 for _, k, _ in TIMING_PHASES[:4] if k)
                vals.append(max(total - parts, 0.0) if total is not None else 0.0)
            else:
                vals.append(max(_num(r.get(key)) or 0.0, 0.0))
        stacks.append((name, c, vals))
    title = "Time per step (seconds, stacked)"
    svg = stacked_bars(title, steps, stacks, "metrics.jsonl has no timing/*_s")
    shown = [(n, c, False) for n, c, v in stacks if any(x > 0 for x in v)]
    return title, svg, _legend(shown)


def _layers(records: list[dict[str, Any]]) -> list[int]:
    """The MoE layers the records hold load metrics for (``moe/layer_<i>/entropy``), in order."""
    return sorted(int(x) for x in _domains(records, r"^moe/layer_(\d+)/entropy$"))


def moe_charts(records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(title, svg, legend html) of the expert-load charts of an MoE run, in page order; ``[]`` for a dense
    run (no ``moe/layer_<i>/entropy`` in any record). One line per layer on the entropy and max/mean charts,
    a line per expert on each layer's token-share chart (only where per-expert counts were logged)."""
    layers = _layers(records)
    if not layers:
        return []
    color = {i: DOMAIN_COLORS[i % len(DOMAIN_COLORS)] for i in layers}
    out = []
    for title, key, ref_key, ref_name in (
        ("Expert load entropy per layer (nats)", "entropy", "moe/entropy_balanced", "even load (log experts)"),
        ("Expert load max/mean per layer", "max_mean", None, "even load (1)"),
    ):
        ss = [Series(f"layer {i}", _series(records, f"moe/layer_{i}/{key}"), color[i]) for i in layers]
        steps = [x for s in ss for x, v in s.points if v is not None]
        ref = _series(records, ref_key) if ref_key else [(x, 1.0) for x in sorted(set(steps))]
        ss.append(Series(ref_name, ref, BALANCED_COLOR, dashed=True))
        ss = [s for s in ss if any(v is not None for _, v in s.points)]
        why = f"metrics.jsonl has no moe/layer_<i>/{key}"
        out.append((title, line_chart(title, ss, why), _legend((s.name, s.color, s.dashed) for s in ss)))
    out.append(_disagreement_chart(records))
    out += [_expert_share_chart(records, i) for i in layers]
    return [c for c in out if c is not None]


def _disagreement_chart(records: list[dict[str, Any]]) -> tuple[str, str, str] | None:
    """``moe/routing_disagreement`` (solid) and per domain (dashed), or None where never logged."""
    doms = _domains(records, r"^moe/routing_disagreement/([^/]+)$")
    ss = [Series("all", _series(records, "moe/routing_disagreement"), KL_COLOR)]
    ss += [
        Series(d, _series(records, f"moe/routing_disagreement/{d}"), DOMAIN_COLORS[k % len(DOMAIN_COLORS)], True)
        for k, d in enumerate(doms)
    ]
    ss = [s for s in ss if any(v is not None for _, v in s.points)]
    if not ss:
        return None
    title = "Routing disagreement, engine vs learner (share of token-layer selections)"
    return title, line_chart(title, ss, "", y_zero=True), _legend((s.name, s.color, s.dashed) for s in ss)


def _expert_share_chart(records: list[dict[str, Any]], layer: int) -> tuple[str, str, str] | None:
    """Each expert's share of layer ``layer``'s tokens per step (``moe/layer_<i>/tokens_expert_<e>`` over
    their sum), or None where the records hold no per-expert counts."""
    rx = re.compile(rf"^moe/layer_{layer}/tokens_expert_(\d+)$")
    experts = sorted({int(m.group(1)) for r in records for k in r if (m := rx.match(k))})
    if not experts:
        return None
    keys = [f"moe/layer_{layer}/tokens_expert_{e}" for e in experts]
    points: dict[int, list[tuple[float, float | None]]] = {e: [] for e in experts}
    for r in records:
        counts = [_num(r.get(k)) for k in keys]
        total = sum(c for c in counts if c is not None)
        if not any(k in r for k in keys):
            continue
        for e, c in zip(experts, counts):
            points[e].append((r["step"], c / total if c is not None and total > 0 else None))
    ss = [Series(f"expert {e}", points[e], DOMAIN_COLORS[e % len(DOMAIN_COLORS)]) for e in experts]
    ss = [s for s in ss if any(v is not None for _, v in s.points)]
    title = f"Token share per expert, layer {layer}"
    svg = line_chart(title, ss, f"no token counts for layer {layer}", y_zero=True)
    return title, svg, _legend((s.name, s.color, False) for s in ss)


def _experts_html(records: list[dict[str, Any]]) -> str:
    """The "Experts" section of an MoE run's page; "" for a dense run."""
    figs = moe_charts(records)
    if not figs:
        return ""
    body = "".join(f"<figure><figcaption>{_e(t)}</figcaption>{svg}{legend}</figure>" for t, svg, legend in figs)
    return (
        '<h2 id="experts">Experts (mixture of experts)</h2><p class="meta">The load of the batch\'s tokens over '
        "each layer's experts in the pass that computes the old log-probs (docs/moe.md).</p>"
        f'<div class="grid">{body}</div>'
    )


# ---------------------------------------------------------------------------- the page


def _cut(s: Any) -> str:
    s = "" if s is None else str(s)
    if len(s) > MAX_TEXT:
        return s[:MAX_TEXT] + f"\n... ({len(s) - MAX_TEXT} more characters not shown)"
    return s


def _rollout_card(r: dict[str, Any], kind: str) -> str:
    rew = _num(r.get("reward"))
    scores = r.get("scores") if isinstance(r.get("scores"), dict) else {}
    bits = [f"<b>{kind}</b>", f"reward {rew:.3f}" if rew is not None else "reward: none"]
    bits += [f"{_e(k)} {v:.3f}" if _num(v) is not None else f"{_e(k)} n/a" for k, v in sorted(scores.items())]
    if r.get("response_tokens") is not None:
        bits.append(f"{_e(r.get('response_tokens'))} tokens")
    if r.get("finish_reason"):
        bits.append(f"finish: {_e(r.get('finish_reason'))}")
    bits.append(f"task <code>{_e(r.get('task_id', ''))}</code>")
    err = f'<div class="err">reward error: {_e(_cut(r["reward_error"]))}</div>' if r.get("reward_error") else ""
    return (
        f'<div class="rollout {kind}"><div class="rhead">{" &middot; ".join(bits)}</div>{err}'
        f"<details><summary>prompt</summary><pre>{_e(_cut(r.get('prompt')))}</pre></details>"
        f'<pre class="response">{_e(_cut(r.get("response")))}</pre></div>'
    )


def _rollouts_html(last: dict[str, tuple[int, list[dict[str, Any]]]], k: int = ROLLOUTS_SHOWN) -> str:
    if not last:
        return "<p>No rollouts: rollouts.jsonl is missing or empty.</p>"
    out = []
    for split in sorted(last, key=lambda s: (s != "train", s)):
        step, rows = last[split]
        by_dom: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_dom.setdefault(str(r.get("domain", "")), []).append(r)
        what = "last train step" if split == "train" else "last evaluation" if split == "eval" else "last step"
        out.append(f"<h3>{_e(split)}: {what} (step {step})</h3>")
        for d, rs in sorted(by_dom.items()):
            # None (reward error) counts as the worst; ties keep file order.
            ranked = sorted(
                rs, key=lambda r: -(_num(r.get("reward")) if _num(r.get("reward")) is not None else -math.inf)
            )
            best = ranked[:k]
            worst = ranked[max(k, len(ranked) - k) :][::-1]
            mean = [_num(r.get("reward")) for r in rs]
            mean = [m for m in mean if m is not None]
            avg = f", mean reward {sum(mean) / len(mean):.3f}" if mean else ""
            out.append(
                f'<div class="domain"><h4>{_e(d)} <span class="muted">({len(rs)} rollouts{avg})</span></h4>'
                f'<div class="cols"><div><h5>best</h5>{"".join(_rollout_card(r, "best") for r in best)}</div>'
                f"<div><h5>worst</h5>{''.join(_rollout_card(r, 'worst') for r in worst) or '<p>(no more rollouts)</p>'}"
                f"</div></div></div>"
            )
    return "".join(out)


def _reward_table(records: list[dict[str, Any]]) -> str:
    rows = []
    for prefix, label in (("reward/", "train"), ("eval/reward/", "eval")):
        rx = "^" + re.escape(prefix) + r"([^/]+)/mean$"
        for d in _domains(records, rx):
            key = f"{prefix}{d}/mean"
            vals = [(r["step"], _num(r.get(key))) for r in records if _num(r.get(key)) is not None]
            if vals:
                (s0, v0), (s1, v1) = vals[0], vals[-1]
                rows.append(
                    f"<tr><td>{_e(d)}</td><td>{label}</td><td>{v0:.3f} <span class=muted>(step {s0})</span></td>"
                    f"<td>{v1:.3f} <span class=muted>(step {s1})</span></td></tr>"
                )
    if not rows:
        return ""
    return (
        '<table class="summary"><tr><th>domain</th><th>split</th><th>first</th><th>last</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def sandbox_events_table(records: list[dict[str, Any]]) -> str:
    """Sandbox events (``sandbox/<domain>/<event>`` step metrics, train and eval) with their total,
    the steps they happened at, and the last; only events that happened. "" when none did."""
    rx = re.compile(r"^(eval/)?sandbox/([^/]+)/([^/]+)$")
    seen: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for r in records:
        for k, v in r.items():
            m = rx.match(k)
            n = _num(v)
            if m and n:
                seen.setdefault((m.group(2), m.group(3), "eval" if m.group(1) else "train"), []).append((r["step"], n))
    if not seen:
        return ""
    rows = []
    for (domain, event, split), hits in sorted(seen.items()):
        steps = ", ".join(str(s) for s, _ in hits[-8:]) + (" ..." if len(hits) > 8 else "")
        rows.append(
            f"<tr><td>{_e(domain)}</td><td>{_e(event)}</td><td>{split}</td>"
            f"<td>{sum(n for _, n in hits):g}</td><td>{_e(steps)}</td></tr>"
        )
    return (
        '<h2 id="sandbox">Sandbox events</h2><table class="summary"><tr><th>domain</th><th>event</th>'
        "<th>split</th><th>total</th><th>steps (last 8)</th></tr>" + "".join(rows) + "</table>"
    )


CSS = """
body{font-family:"DejaVu Sans",Helvetica,Arial,sans-serif;margin:24px;color:#222;background:#fff;max-width:1200px}
h1{font-size:22px;margin:0 0 6px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}h4{font-size:14px;margin:12px 0 4px}h5{font-size:12px;margin:4px 0;color:#555}
.muted{color:#777;font-weight:normal}.meta{color:#555;font-size:13px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:18px}
figure{margin:0}figcaption{font-size:14px;font-weight:bold;margin-bottom:2px}
svg.chart{display:block;max-width:100%;height:auto}svg .bg{fill:#fff}
svg .grid{stroke:#e6e6e6;stroke-width:1}svg .axis,svg .tickmark{stroke:#888;stroke-width:1}
svg .tick{font-size:11px;fill:#555}svg .label{font-size:12px;fill:#444}svg .nodata{font-size:18px;fill:#999}
.legend{font-size:12px;color:#333}.key{margin-right:14px;white-space:nowrap}
.key i{display:inline-block;width:14px;height:0;margin-right:4px;vertical-align:middle}
table.summary{border-collapse:collapse;font-size:13px;margin:8px 0}
table.summary td,table.summary th{border:1px solid #ddd;padding:3px 8px;text-align:left}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.rollout{border:1px solid #ddd;border-radius:4px;padding:6px 8px;margin:6px 0;font-size:12px}
.rollout.best{border-left:4px solid #2ca02c}.rollout.worst{border-left:4px solid #d62728}
.rhead{color:#333;margin-bottom:4px}.err{color:#b00}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:6px;margin:4px 0;font-size:12px;
font-family:"DejaVu Sans Mono",monospace;max-height:360px;overflow:auto}
"""


def render_report(run_dir: str | os.PathLike[str]) -> str:
    """The HTML of the report of ``run_dir`` (see the module docstring)."""
    from rl.cli.runs import run_info, status_text

    d = Path(run_dir)
    if not d.is_dir():
        raise ReportError(f"run dir not found: {d}")
    if not (d / "metrics.jsonl").is_file():
        raise ReportError(f"{d} is not a run dir (no metrics.jsonl)")
    records = read_metrics(d / "metrics.jsonl")
    info = run_info(d)
    recipe_path = d / "recipe.resolved.yaml"
    recipe = recipe_path.read_text(errors="replace") if recipe_path.is_file() else ""
    figs = "".join(
        f"<figure><figcaption>{_e(t)}</figcaption>{svg}{legend}</figure>" for t, svg, legend in charts(records)
    )
    steps = f"{info.steps}" + (f" of {info.total_steps}" if info.total_steps else "")
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return "".join(
        [
            '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">',
            f"<title>jointrl report: {_e(d.resolve().name)}</title><style>{CSS}</style></head><body>",
            f"<h1>jointrl run report: {_e(d.resolve().name)}</h1>",
            f'<p class="meta">status <b>{_e(status_text(info))}</b> &middot; steps {_e(steps)} &middot; <code>{_e(d.resolve())}</code>'
            f" &middot; generated {_e(now)}</p>",
            _reward_table(records),
            sandbox_events_table(records),
            '<h2 id="charts">Charts</h2><div class="grid">',
            figs,
            "</div>",
            _experts_html(records),
            '<h2 id="rollouts">Rollouts: best and worst per domain</h2>',
            _rollouts_html(last_rollouts(d / "rollouts.jsonl")),
            '<h2 id="recipe">Recipe (recipe.resolved.yaml)</h2>',
            f"<pre>{_e(recipe)}</pre>" if recipe else "<p>No recipe.resolved.yaml in the run dir.</p>",
            "</body></html>\n",
        ]
    )


def write_report(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``<run_dir>/report.html``); return its path."""
    return _write_html(Path(out) if out is not None else Path(run_dir) / "report.html", render_report(run_dir))


def _write_html(dest: Path, text: str) -> Path:
    """``text`` into ``dest`` through a temporary file (a reader never sees half a page); ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, dest)
    return dest


# ---------------------------------------------------------------------------- several seeds of one recipe


def seed_curves(runs: dict[str, list[dict[str, Any]]]) -> list[tuple[str, str, str]]:
    """(title, svg, legend html): per domain, the held-out mean reward (``eval/reward/<d>/mean``) against
    the step, one line per run of ``runs`` (``{label: metrics records}``, e.g. one per seed)."""
    doms = sorted({d for recs in runs.values() for d in _domains(recs, r"^eval/reward/([^/]+)/mean$")})
    color = {label: DOMAIN_COLORS[i % len(DOMAIN_COLORS)] for i, label in enumerate(runs)}
    out = []
    for d in doms:
        title = f"Held-out reward, {d} (eval/reward/{d}/mean)"
        ss = [Series(label, _series(recs, f"eval/reward/{d}/mean"), color[label]) for label, recs in runs.items()]
        ss = [s for s in ss if any(v is not None for _, v in s.points)]
        out.append(
            (
                title,
                line_chart(title, ss, "no held-out evaluation", True),
                _legend((s.name, s.color, False) for s in ss),
            )
        )
    return out


def render_seed_report(runs: dict[str, Path], title: str, summary: str = "") -> str:
    """One HTML page over several runs of one recipe (a seed sweep, ``bench/seeds.py``): ``summary`` (text,
    shown as is) and a held-out curve per domain with a line per run; a run without ``metrics.jsonl`` is
    named as such and drawn nowhere."""
    recs = {label: read_metrics(d / "metrics.jsonl") for label, d in runs.items() if (d / "metrics.jsonl").is_file()}
    missing = [label for label in runs if label not in recs]
    figs = "".join(
        f"<figure><figcaption>{_e(t)}</figcaption>{svg}{legend}</figure>" for t, svg, legend in seed_curves(recs)
    )
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return "".join(
        [
            '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">',
            f"<title>jointrl report: {_e(title)}</title><style>{CSS}</style></head><body>",
            f"<h1>jointrl report: {_e(title)}</h1>",
            f'<p class="meta">{len(runs)} runs &middot; generated {_e(now)}</p>',
            f"<pre>{_e(summary)}</pre>" if summary else "",
            f'<p class="err">no metrics.jsonl: {_e(", ".join(missing))}</p>' if missing else "",
            '<h2 id="seeds">Held-out reward per domain, one line per run</h2>',
            '<p class="meta">The trainer\'s held-out means (an unscored sample is left out of them).</p>',
            f'<div class="grid">{figs}</div>' if figs else "<p>No run holds a held-out evaluation.</p>",
            "</body></html>\n",
        ]
    )


def write_seed_report(runs: dict[str, Path], out: str | os.PathLike[str], title: str, summary: str = "") -> Path:
    """Write ``render_seed_report`` to ``out``; return its path."""
    return _write_html(Path(out), render_seed_report(runs, title, summary))


# ---------------------------------------------------------------------------- CLI


def add_parser(sub: Any) -> None:
    """Add ``jointrl report RUN_DIR [--out FILE]`` to ``jointrl``'s subparsers."""
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a run",
        description="Write one self-contained HTML file (charts, best and worst rollouts, recipe) "
        "for a run dir, finished or still running.",
    )
    p.add_argument("run_dir", help="a run's output dir (holds metrics.jsonl)")
    p.add_argument("--out", help="HTML file to write (default: RUN_DIR/report.html)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    try:
        path = write_report(args.run_dir, args.out)
    except (ReportError, OSError) as e:
        if getattr(args, "debug", False):
            raise
        print(f"jointrl: error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m rl.cli.report RUN_DIR [--out FILE]``."""
    p = argparse.ArgumentParser(prog="python -m rl.cli.report")
    sub = p.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = p.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
