"""The report's y-axis labels read their own ticks' values: a metric that moves in its fourth significant
digit (the policy's entropy over a few steps) got five labels that all read "10.4"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rl.cli.report import render_report, tick_labels


def _axis_labels(html: str, title: str) -> list[tuple[float, str]]:
    """(y position, text) of each y-axis tick label of the chart titled ``title``."""
    svg = next(s for s in re.findall(r"<svg.*?</svg>", html, re.S) if f'aria-label="{title}"' in s)
    ticks = re.findall(r'<text class="tick" x="[\d.]+" y="([\d.]+)" text-anchor="end">([^<]*)</text>', svg)
    return [(float(y), t) for y, t in ticks]


def test_entropy_axis_labels_are_distinct_and_ordered(tmp_path: Path) -> None:
    entropies = [10.3712, 10.3716, 10.3721, 10.3725, 10.3729]
    recs = [{"step": s, "reward/mean": 0.5, "entropy/mean": e, "kl/mean": 0.001 * s} for s, e in enumerate(entropies)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    html = render_report(tmp_path)
    labels = _axis_labels(html, "Entropy (entropy/mean)")
    assert len(labels) >= 3
    texts = [t for _, t in labels]
    assert len(set(texts)) == len(texts), texts
    values = [float(t) for t in texts]
    # ticks drawn top to bottom as values go down, and the data lie within the labelled range
    assert [v for _, v in sorted(zip([y for y, _ in labels], values), reverse=True)] == sorted(values)
    assert min(values) <= min(entropies) and max(values) >= max(entropies)
    kl = [t for _, t in _axis_labels(html, "KL to the reference (kl/mean)")]
    assert len(set(kl)) == len(kl), kl


@pytest.mark.parametrize(
    "ticks, want",
    [
        ([10.371, 10.3715, 10.372], ["10.3710", "10.3715", "10.3720"]),
        ([0.0, 0.25, 0.5, 0.75, 1.0], ["0", "0.25", "0.50", "0.75", "1.00"]),
        ([0.0, 2000.0, 4000.0], ["0", "2,000", "4,000"]),
        ([1e-05, 2e-05, 3e-05], ["1e-05", "2e-05", "3e-05"]),
        ([-0.02, 0.0, 0.02], ["-0.02", "0", "0.02"]),
    ],
)
def test_tick_labels(ticks: list[float], want: list[str]) -> None:
    assert tick_labels(ticks) == want
