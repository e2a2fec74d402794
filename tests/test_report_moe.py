"""The "Experts" section of ``jointrl report``: expert-load charts of an MoE run from a synthetic metrics.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rl.cli.report import moe_charts, read_metrics, render_report
from tests.test_report import make_run, parse

LAYERS, EXPERTS, STEPS = 2, 4, 3


def _moe_records(per_expert: bool) -> list[dict]:
    recs = []
    for s in range(1, STEPS + 1):
        r: dict = {"step": s, "moe/entropy_balanced": math.log(EXPERTS)}
        for i in range(LAYERS):
            counts = [10 + s * (e + i) for e in range(EXPERTS)]
            total = sum(counts)
            r[f"moe/layer_{i}/entropy"] = -sum(c / total * math.log(c / total) for c in counts)
            r[f"moe/layer_{i}/max_mean"] = max(counts) / (total / EXPERTS)
            if per_expert:
                r |= {f"moe/layer_{i}/tokens_expert_{e}": float(c) for e, c in enumerate(counts)}
        r["moe/routing_disagreement"] = 0.1 * s
        r["moe/routing_disagreement/tool_call"] = 0.1 * s
        recs.append(r)
    return recs


def _moe_run(d: Path, per_expert: bool) -> Path:
    make_run(d, steps=STEPS)
    base = read_metrics(d / "metrics.jsonl")
    moe = {r["step"]: r for r in _moe_records(per_expert)}
    (d / "metrics.jsonl").write_text("".join(json.dumps(r | moe.get(r["step"], {})) + "\n" for r in base))
    return d


def _series_names(svg: str) -> list[str]:
    return [a["data-name"] for t, a in parse(svg).tags if t == "path" and a.get("class") == "series"]


def _path_points(svg: str, name: str) -> int:
    [d] = [a["d"] for t, a in parse(svg).tags if t == "path" and a.get("data-name") == name]
    return len(d.split())


def test_moe_run_gets_entropy_and_max_mean_per_layer_and_expert_shares(tmp_path: Path) -> None:
    run = _moe_run(tmp_path / "moe", per_expert=True)
    text = render_report(run)
    assert '<h2 id="experts">' in text
    charts = {t: svg for t, svg, _ in moe_charts(read_metrics(run / "metrics.jsonl"))}
    titles = list(charts)
    assert titles[:2] == ["Expert load entropy per layer (nats)", "Expert load max/mean per layer"]
    ent = charts["Expert load entropy per layer (nats)"]
    assert _series_names(ent) == ["layer 0", "layer 1", "even load (log experts)"]
    assert all(_path_points(ent, f"layer {i}") == STEPS for i in range(LAYERS))
    assert _series_names(charts["Expert load max/mean per layer"]) == ["layer 0", "layer 1", "even load (1)"]
    dis = next(svg for t, svg in charts.items() if t.startswith("Routing disagreement"))
    assert _series_names(dis) == ["all", "tool_call"]
    for i in range(LAYERS):  # one line per expert, its share of the layer's tokens
        share = charts[f"Token share per expert, layer {i}"]
        assert _series_names(share) == [f"expert {e}" for e in range(EXPERTS)]
    # The values drawn are the records' own: a tooltip carries each point's value.
    last = _moe_records(True)[-1]
    assert f"layer 1 step {STEPS}: {last['moe/layer_1/max_mean']:.4g}" in charts["Expert load max/mean per layer"]
    counts = [last[f"moe/layer_0/tokens_expert_{e}"] for e in range(EXPERTS)]
    assert f"expert 3 step {STEPS}: {counts[3] / sum(counts):.4g}" in charts["Token share per expert, layer 0"]


def test_moe_run_without_per_expert_counts_has_no_share_charts(tmp_path: Path) -> None:
    run = _moe_run(tmp_path / "moe", per_expert=False)
    titles = [t for t, _, _ in moe_charts(read_metrics(run / "metrics.jsonl"))]
    assert len(titles) == 3 and not any(t.startswith("Token share") for t in titles)
    assert render_report(run).count('<svg class="chart"') == 5 + 3


def test_dense_run_has_no_experts_section(tmp_path: Path) -> None:
    run = make_run(tmp_path / "dense")
    text = render_report(run)
    assert moe_charts(read_metrics(run / "metrics.jsonl")) == []
    assert 'id="experts"' not in text and "Expert load" not in text
    assert text.count('<svg class="chart"') == 5
