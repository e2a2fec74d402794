"""``jointrl report``: the HTML report of a run, checked as HTML and rendered in headless Chromium."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from rl.cli.report import (
    DOMAIN_COLORS,
    ENTROPY_COLOR,
    KL_COLOR,
    TIMING_PHASES,
    ReportError,
    add_parser,
    last_rollouts,
    read_metrics,
    render_report,
    write_report,
)

INJECT = '</pre><script>alert("x")</script><img src=x onerror=alert(1)> & "quotes"'
DOMAINS = ("code", "tool_call")


def _metrics(steps: int = 4) -> list[dict]:
    recs = [
        {
            "step": 0,
            "eval/reward/mean": 0.1,
            "eval/reward/code/mean": 0.05,
            "eval/reward/tool_call/mean": 0.15,
            "eval/rollout/code/response_len/mean": 40.0,
            "eval/rollout/tool_call/response_len/mean": 30.0,
            "timing/eval_s": 3.0,
        }
    ]
    for s in range(1, steps + 1):
        r = {
            "step": s,
            "reward/mean": 0.1 * s,
            "kl/mean": 0.001 * s,
            "entropy/mean": 2.0 - 0.1 * s,
            "timing/rollout_s": 2.0,
            "timing/reward_s": 0.5,
            "timing/learner_s": 4.0 + s,
            "timing/sync_s": 0.3,
            "timing/step_s": 8.0 + s,
        }
        for i, d in enumerate(DOMAINS):
            r[f"reward/{d}/mean"] = 0.1 * s + 0.05 * i
            r[f"reward/{d}/fn/mean"] = 0.1 * s  # a per-function key: not a domain
            r[f"rollout/{d}/response_len/mean"] = 50.0 - s + 5 * i
        recs.append(r)
    last = recs[-1]
    last |= {
        "eval/reward/mean": 0.4,
        "eval/reward/code/mean": 0.35,
        "eval/reward/tool_call/mean": 0.45,
        "eval/rollout/code/response_len/mean": 44.0,
        "eval/rollout/tool_call/response_len/mean": 33.0,
        "timing/eval_s": 3.5,
    }
    return recs


def _row(step: int, split: str, domain: str, i: int, reward: float | None, response: str) -> dict:
    return {
        "step": step,
        "split": split,
        "domain": domain,
        "task_id": f"{domain}-{split}-{i}",
        "group": i // 2,
        "prompt": f"prompt {i} <b>bold?</b>",
        "response": response,
        "reward": reward,
        "scores": {"fn": reward},
        "reward_error": None if reward is not None else "ValueError: boom",
        "finish_reason": "stop",
        "terminated": True,
        "truncated": False,
        "response_tokens": 10 + i,
    }


def make_run(d: Path, steps: int = 4, done: bool = True) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _metrics(steps)))
    rows = []
    for s in range(0, steps + 1):
        for dom in DOMAINS:
            if s == 0 or s == steps:
                rows += [_row(s, "eval", dom, i, i / 4, f"eval answer {dom} {s} {i}") for i in range(5)]
            if s >= 1:
                for i in range(6):
                    resp = f"train answer {dom} {s} {i}"
                    if s == steps and dom == "tool_call" and i == 5:
                        resp = "BEST " + INJECT
                    rows.append(_row(s, "train", dom, i, None if (i == 0 and dom == "code") else i / 5, resp))
    (d / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "recipe.resolved.yaml").write_text(f"train:\n  steps: {steps}\nwandb:\n  run_name: '{INJECT}'\n")
    if done:
        (d / "DONE").write_text(json.dumps({"steps": steps}) + "\n")
    return d


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.stack: list[str] = []
        self.charts: list[dict] = []  # per svg.chart: attrs, count of series paths/groups, rects, texts

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "svg" and "chart" in (a.get("class") or ""):
            self.charts.append({"attrs": a, "paths": 0, "groups": 0, "rects": 0, "text": ""})
        elif self.charts and "svg" in self.stack:
            c = self.charts[-1]
            if tag == "path" and a.get("class") == "series":
                c["paths"] += 1
            if tag == "g" and a.get("class") == "series":
                c["groups"] += 1
            if tag == "rect" and a.get("class") != "bg":
                c["rects"] += 1
        if tag not in ("path", "line", "rect", "circle", "meta", "br", "img"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.stack:
            while self.stack and self.stack.pop() != tag:
                pass

    def handle_data(self, data):
        if self.charts and "svg" in self.stack:
            self.charts[-1]["text"] += data


def parse(text: str) -> _Tags:
    p = _Tags()
    p.feed(text)
    return p


def test_report_structure_and_escaping(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    path = write_report(run)
    assert path == run / "report.html"
    text = path.read_text()
    p = parse(text)
    # Five charts: reward per domain (2 domains x train/eval), KL, entropy, length (2 x train/eval), timing.
    series = [int(c["attrs"]["data-series"]) for c in p.charts]
    assert series == [4, 1, 1, 4, 6], series
    for c in p.charts[:4]:
        assert c["paths"] == int(c["attrs"]["data-series"])  # one <path class="series"> per line series
    timing = p.charts[4]
    assert timing["groups"] == 6 and timing["paths"] == 0
    # steps 1..4: rollout, reward, learner, sync, other (step_s - parts = 1.2 s); eval at steps 0 and 4.
    assert timing["rects"] == 4 * 5 + 2
    # Self-contained and nothing from the run became markup: no scripts, images or external references.
    assert not [t for t, _ in p.tags if t in ("script", "img", "iframe", "link", "object", "embed")]
    assert not [a for _, a in p.tags if "src" in a or "href" in a or any(k.startswith("on") for k in a)]
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    assert "&lt;b&gt;bold?&lt;/b&gt;" in text
    # Best and worst per domain of the last train step and of the last evaluation.
    assert "train: last train step (step 4)" in text and "eval: last evaluation (step 4)" in text
    assert text.index("BEST &lt;/pre&gt;") < text.index("train answer tool_call 4 0")  # best before worst
    assert "reward error: ValueError: boom" in text  # an errored sample counts as the worst
    assert "eval answer code 0" not in text  # only the last evaluation
    assert "status <b>done</b>" in text and "steps 4 of 4" in text
    # The recipe, escaped.
    assert "run_name: &#x27;&lt;/pre&gt;&lt;script&gt;" in text


def test_report_missing_keys_and_running_run(tmp_path: Path) -> None:
    run = tmp_path / "partial"
    run.mkdir()
    # Only the initial evaluation, then a line still being written; no DONE, no rollouts, no recipe.
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "eval/reward/mean": 0.2, "eval/reward/x/mean": 0.2, "timing/eval_s": 1.5})
        + "\n"
        + '{"step": 1, "rew'
    )
    text = render_report(run)
    p = parse(text)
    assert [int(c["attrs"]["data-series"]) for c in p.charts] == [1, 0, 0, 0, 1]
    for c in p.charts[1:4]:
        assert "no data" in c["text"] and c["paths"] == 0
    assert "status <b>running</b>" in text
    assert "No rollouts" in text and "No recipe.resolved.yaml" in text
    # An empty metrics file (a run that just started): every chart says no data.
    (run / "metrics.jsonl").write_text("")
    assert [int(c["attrs"]["data-series"]) for c in parse(render_report(run)).charts] == [0, 0, 0, 0, 0]


def test_report_errors_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ReportError, match="run dir not found"):
        render_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no metrics.jsonl"):
        render_report(tmp_path / "empty")
    run = make_run(tmp_path / "run", steps=3, done=False)
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="cmd"))
    out = tmp_path / "sub" / "r.html"
    args = parser.parse_args(["report", str(run), "--out", str(out)])
    assert args.run(args) == 0 and out.is_file() and not (run / "report.html").exists()
    assert str(out) in capsys.readouterr().out
    args = parser.parse_args(["report", str(tmp_path / "empty")])
    assert args.run(args) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_readers_tolerate_bad_lines_and_keep_last_steps(tmp_path: Path) -> None:
    m = tmp_path / "metrics.jsonl"
    m.write_text('{"step": 1, "a": 1}\nnot json\n{"step": 1, "a": 2}\n{"step": 0, "a": 0}\n{"no_step": 1}\n')
    assert [(r["step"], r["a"]) for r in read_metrics(m)] == [(0, 0), (1, 2)]
    run = make_run(tmp_path / "run", steps=3)
    last = last_rollouts(run / "rollouts.jsonl")
    assert {k: (v[0], len(v[1])) for k, v in last.items()} == {"train": (3, 12), "eval": (3, 10)}


def test_many_steps_are_averaged_into_bars(tmp_path: Path) -> None:
    run = tmp_path / "long"
    run.mkdir()
    recs = [
        {"step": s, "timing/rollout_s": 1.0, "timing/step_s": 1.0, "reward/mean": s / 1000, "reward/a/mean": 0.5}
        for s in range(1, 1001)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    p = parse(render_report(run))
    assert p.charts[4]["rects"] == 200  # MAX_BARS


# ---------------------------------------------------------------------------- headless Chromium


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        exe = shutil.which(name)
        if exe:
            return exe
    pytest.skip("chromium is not installed (`bash .ci/install.sh` installs the Debian package `chromium`)")


def _run_chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--force-color-profile=srgb",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={tmp / 'profile'}",
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(tmp)})
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def _png_rgb(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit RGB/RGBA PNG; Pillow when present, else a small decoder."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            raw = im.tobytes()
        return w, h, [raw[y * w * 3 : (y + 1) * w * 3] for y in range(h)]
    except ImportError:
        pass
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h, bpp = 8, b"", 0, 0, 3
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, rows, prev, stride = zlib.decompress(idat), [], bytearray(w * bpp), w * bpp
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = line
        rows.append(bytes(line) if bpp == 3 else bytes(v for j in range(0, stride, 4) for v in line[j : j + 3]))
    return w, h, rows


def _color_counts(path: Path, colors: list[str]) -> dict[str, int]:
    want = {c: tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in colors}
    counts = dict.fromkeys(colors, 0)
    _, _, rows = _png_rgb(path)
    for row in rows:
        for i in range(0, len(row), 3):
            px = row[i], row[i + 1], row[i + 2]
            for c, rgb in want.items():
                if abs(px[0] - rgb[0]) <= 6 and abs(px[1] - rgb[1]) <= 6 and abs(px[2] - rgb[2]) <= 6:
                    counts[c] += 1
    return counts


PROBE = """<script>
document.querySelectorAll('svg.chart').forEach(svg => {
  const r = svg.getBoundingClientRect();
  const drawn = [...svg.querySelectorAll('.series')].map(s => { const b = s.getBBox(); return b.width > 1 ? 1 : 0; });
  svg.setAttribute('data-probe', `${Math.round(r.width)}x${Math.round(r.height)};` + drawn.join(','));
});
</script>"""


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    exe = _chromium()
    run = make_run(tmp_path / "run", steps=6)
    html_path = write_report(run)
    # 1. Layout: Chromium lays out every chart at its size and every series has a drawn extent.
    probe = tmp_path / "probe.html"
    probe.write_text(html_path.read_text().replace("</body>", PROBE + "</body>"))
    dom = _run_chromium(exe, tmp_path, "--dump-dom", "--virtual-time-budget=3000", probe.as_uri()).stdout
    p = parse(dom)
    assert len(p.charts) == 5, dom[:500]
    for c in p.charts:
        size, _, drawn = c["attrs"].get("data-probe", "").partition(";")
        w, h = (int(x) for x in size.split("x"))
        assert w >= 400 and h >= 150, c["attrs"]
        assert drawn.split(",") == ["1"] * int(c["attrs"]["data-series"]), c["attrs"]
    # 2. Pixels: the unmodified report as a screenshot; every chart's colours are painted (lines and
    # bars, far more pixels than the legend swatches have), and a report without data paints none.
    shot = tmp_path / "report.png"
    t0 = time.perf_counter()
    _run_chromium(exe, tmp_path, f"--screenshot={shot}", "--window-size=1280,1400", html_path.as_uri())
    assert shot.is_file() and time.perf_counter() - t0 < 170
    timing_colors = [c for name, _, c in TIMING_PHASES if name != "reward"]  # reward_s bars are only ~20 px tall
    colors = [DOMAIN_COLORS[0], DOMAIN_COLORS[1], KL_COLOR, ENTROPY_COLOR, *timing_colors]
    counts = _color_counts(shot, colors)
    for c in colors:
        assert counts[c] > 300, (c, counts)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    shot2 = tmp_path / "empty.png"
    _run_chromium(exe, tmp_path, f"--screenshot={shot2}", "--window-size=1280,1400", write_report(empty).as_uri())
    assert all(v < 50 for v in _color_counts(shot2, colors).values())
