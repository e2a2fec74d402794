"""Why seeds diverge: each run's per-domain training signal, normalization and update statistics, side by side.

Reads finished run folders (``metrics.jsonl``, ``rollouts.jsonl``, ``recipe.resolved.yaml``; e.g. the
``seed_<S>`` folders of a ``bench/seeds.py`` sweep) and prints, per run and domain:

* **signal**: prompts (groups) drawn per step; groups with reward variance per step (the only ones a
  group-baseline estimator learns from; with ``algo.update.zero_variance: drop`` the only ones
  trained), their minimum and the steps where the domain had none; the zero-variance fraction;
  the samples with signal over the run; the domain's share of each step's trained tokens;
* **normalization** (``algo.reward_norm``): the domain's running reward std at the first and last
  step, and how far it moves with one batch (the largest and median ``|log(std_t / std_t-1)|``
  after the first step, and after the warm-up steps ``--warm``); beside it, the spread of the
  one-batch std (what a per-batch statistic would have divided by);
* **advantage scale**: the mean and coefficient of variation over steps of ``adv/<d>/std``;
* **reward**: the train reward's mean over the first and last third of the steps; the held-out base,
  final, paired gain and its SE (``bench/seesaw.py``), and every held-out evaluation's mean (the curve).

Per run: clip fraction, the KL terms the run logged (``kl/*``, ``async/mismatch_kl``), gradient norm
and the steps whose norm the recipe's ``algo.optim.max_grad_norm`` clipped, and how much one trained
token weighs from step to step: under token-mean aggregation the step's update is averaged over the
tokens that survived the zero-variance filter, so a step where only one group survives moves the
policy as far as a step where every group does (max/min trained tokens; the rank correlation of a
step's trained tokens with its gradient norm: negative when sparse steps push harder).

Across runs, per domain: the held-out gains' mean and SD beside the signal each run had, which is
what the report on seed divergence reads. Only numbers from the files are printed; nothing is trained.

    .venv/bin/python bench/seed_divergence.py /tmp/h49/seed_0 /tmp/h49/seed_1 [--json out.json]
    .venv/bin/python bench/seed_divergence.py --sweep runs/seeds/joint_rl
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.seesaw import eval_steps, paired  # noqa: E402

Evaluation = dict[str, dict[str, float]]


@dataclass
class Group:
    """One prompt's scored samples in one train step."""

    step: int
    domain: str
    rewards: list[float]
    tokens: int  # response tokens of its scored samples

    @property
    def varied(self) -> bool:
        return len(self.rewards) >= 2 and max(self.rewards) != min(self.rewards)


@dataclass
class RunData:
    """A finished run's records, as this analysis reads them."""

    label: str
    path: Path
    seed: int | None
    zero_variance: str  # the recipe's algo.update.zero_variance
    max_grad_norm: float | None  # the recipe's algo.optim.max_grad_norm (None: not recorded)
    metrics: dict[int, dict[str, float]]  # by step
    groups: list[Group]
    evals: dict[int, Evaluation] = field(default_factory=dict)

    @property
    def train_steps(self) -> list[int]:
        return sorted({g.step for g in self.groups})

    @property
    def domains(self) -> list[str]:
        return sorted({g.domain for g in self.groups} | {d for e in self.evals.values() for d in e})


# ---------------------------------------------------------------------------- reading


def load_run(path: Path, label: str = "", max_step: int = 0) -> RunData:
    """A run folder's metrics, train groups and held-out evaluations; ``ValueError`` naming the file when one
    is missing or does not parse. ``max_step`` > 0 keeps the train steps up to it (a run under way beside
    finished ones: compare the same steps); the held-out evaluations are kept whole."""
    import yaml

    path = Path(path)
    for name in ("metrics.jsonl", "rollouts.jsonl"):
        if not (path / name).is_file():
            raise ValueError(f"{path}: no {name} (a run folder holds metrics.jsonl and rollouts.jsonl)")
    recipe = path / "recipe.resolved.yaml"
    cfg = (yaml.safe_load(recipe.read_text()) or {}) if recipe.is_file() else {}
    seed = (cfg.get("run") or {}).get("seed")
    algo = cfg.get("algo") or {}
    zv = (algo.get("update") or {}).get("zero_variance", "keep")
    clip = (algo.get("optim") or {}).get("max_grad_norm")
    metrics: dict[int, dict[str, float]] = {}
    for n, m in _jsonl(path / "metrics.jsonl"):
        if "step" not in m:
            raise ValueError(f"{path / 'metrics.jsonl'}:{n}: a record without 'step'")
        if not max_step or int(m["step"]) <= max_step:
            metrics.setdefault(int(m["step"]), {}).update(m)
    by: dict[tuple[int, str, int], Group] = {}
    for n, r in _jsonl(path / "rollouts.jsonl"):
        if r.get("split") != "train" or r.get("reward") is None or r.get("reward_error"):
            continue
        try:
            key = (int(r["step"]), str(r["domain"]), int(r["group"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path / 'rollouts.jsonl'}:{n}: a train record without step/domain/group ({e})") from None
        if max_step and key[0] > max_step:
            continue
        g = by.setdefault(key, Group(key[0], key[1], [], 0))
        g.rewards.append(float(r["reward"]))
        g.tokens += int(r.get("response_tokens") or 0)
    label = label or (f"seed {seed}" if seed is not None else path.name)
    evals = eval_steps(path / "rollouts.jsonl")
    clip = float(clip) if isinstance(clip, (int, float)) else None
    return RunData(label, path, seed, str(zv), clip, metrics, list(by.values()), evals)


def _jsonl(p: Path):
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}:{n}: not JSON ({e.msg})") from None


# ---------------------------------------------------------------------------- statistics


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _cv(xs: list[float]) -> float | None:
    """Coefficient of variation (population SD / mean); None for fewer than two values or a zero mean."""
    if len(xs) < 2 or not sum(xs):
        return None
    return statistics.pstdev(xs) / abs(statistics.fmean(xs))


def signal_stats(run: RunData, domain: str) -> dict[str, Any]:
    """Per step: groups drawn and with reward variance; the run's totals; the domain's trained-token share."""
    steps = run.train_steps
    drawn = {s: 0 for s in steps}
    varied = {s: 0 for s in steps}
    samples = 0
    tokens_d: dict[int, int] = defaultdict(int)
    tokens_all: dict[int, int] = defaultdict(int)
    for g in run.groups:
        if g.varied or run.zero_variance != "drop":  # what the learner's batch held (its denominator)
            tokens_all[g.step] += g.tokens
        if g.domain != domain:
            continue
        drawn[g.step] += 1
        if g.varied:
            varied[g.step] += 1
            samples += len(g.rewards)
            tokens_d[g.step] += g.tokens
    n_drawn = sum(drawn.values())
    shares = [tokens_d[s] / tokens_all[s] for s in steps if tokens_all[s]]
    return {
        "steps": len(steps),
        "drawn_per_step": _mean([float(drawn[s]) for s in steps]),
        "signal_per_step": _mean([float(varied[s]) for s in steps]),
        "signal_min": min(varied.values()) if steps else None,
        "steps_without": sum(1 for s in steps if varied[s] == 0),
        "signal_groups": sum(varied.values()),
        "drawn_groups": n_drawn,
        "zero_variance_fraction": 1 - sum(varied.values()) / n_drawn if n_drawn else None,
        "signal_samples": samples,
        "token_share": _mean(shares),
        "per_step_signal": [varied[s] for s in steps],
    }


def log_swings(values: list[float]) -> list[float]:
    """``|log(v_t / v_t-1)|`` for consecutive positive values (how far one batch moves a statistic)."""
    return [abs(math.log(b / a)) for a, b in zip(values, values[1:]) if a > 0 and b > 0]


def norm_stats(run: RunData, domain: str, warm: int) -> dict[str, Any]:
    """The domain's running reward std over the steps (``reward/<d>/running_std``): first, last, its largest and
    median one-step swing (all steps, and from step ``warm`` on), and the range of the one-batch std."""
    steps = [s for s in sorted(run.metrics) if f"reward/{domain}/running_std" in run.metrics[s]]
    stds = [run.metrics[s][f"reward/{domain}/running_std"] for s in steps]
    late = [run.metrics[s][f"reward/{domain}/running_std"] for s in steps if s >= warm]
    batch = [run.metrics[s][f"reward/{domain}/raw_std"] for s in steps if f"reward/{domain}/raw_std" in run.metrics[s]]
    sw, sw_late = log_swings(stds), log_swings(late)
    return {
        "std_first": stds[0] if stds else None,
        "std_last": stds[-1] if stds else None,
        "swing_max": max(sw) if sw else None,
        "swing_median": statistics.median(sw) if sw else None,
        "swing_max_after_warm": max(sw_late) if sw_late else None,
        "batch_std_min": min(batch) if batch else None,
        "batch_std_max": max(batch) if batch else None,
    }


def replayed_stds(run: RunData, domain: str, prior_samples: float = 0.0, prior_std: float = 0.5) -> list[float]:
    """The domain's running std after each train step, recomputed from the run's logged rewards with
    ``rl.algos.shaping.RewardNormalizer`` (Welford) under a warm-up prior: what ``algo.reward_norm.prior_samples``
    would have divided by on the same rewards (the policy, and so later rewards, would have moved differently).
    With no prior it is the run's own ``reward/<d>/running_std``."""
    from rl.algos.shaping import RewardNormalizer

    norm = RewardNormalizer("domain", prior_samples=prior_samples, prior_std=prior_std)
    out = []
    for step in run.train_steps:
        rewards = [r for g in run.groups if g.step == step and g.domain == domain for r in g.rewards]
        if rewards:
            norm.update(domain, rewards)
            out.append(norm.std(domain))
    return out


def prior_stats(run: RunData, domain: str, prior: float) -> dict[str, Any]:
    """The running std's first value and one-step swings replayed under ``prior`` pseudo-rewards of std 0.5,
    and how far the replay without a prior is from the logged statistic (a check of the replay)."""
    logged = [
        m[f"reward/{domain}/running_std"] for _, m in sorted(run.metrics.items()) if f"reward/{domain}/running_std" in m
    ]
    plain = replayed_stds(run, domain)
    out: dict[str, Any] = {
        "replay_error": max((abs(a - b) for a, b in zip(plain, logged)), default=None)
        if len(plain) == len(logged)
        else None
    }
    if prior > 0:
        stds = replayed_stds(run, domain, prior)
        sw = log_swings(stds)
        out |= {
            "prior_std_first": stds[0] if stds else None,
            "prior_swing_max": max(sw) if sw else None,
            "prior_swing_median": statistics.median(sw) if sw else None,
        }
    return out


def advantage_stats(run: RunData, domain: str) -> dict[str, Any]:
    """Mean and coefficient of variation over steps of ``adv/<d>/std`` (steps where the domain trained)."""
    xs = [m[f"adv/{domain}/std"] for _, m in sorted(run.metrics.items()) if f"adv/{domain}/std" in m]
    return {"adv_std_mean": _mean(xs), "adv_std_cv": _cv(xs), "adv_steps": len(xs)}


def reward_stats(run: RunData, domain: str) -> dict[str, Any]:
    """Train reward (first and last third of the steps) and the held-out base -> final paired change and curve."""
    train = [m[f"reward/{domain}/mean"] for _, m in sorted(run.metrics.items()) if f"reward/{domain}/mean" in m]
    k = max(len(train) // 3, 1)
    out: dict[str, Any] = {
        "train_first": _mean(train[:k]) if train else None,
        "train_last": _mean(train[-k:]) if train else None,
    }
    ev = {s: e[domain] for s, e in sorted(run.evals.items()) if domain in e}
    out["curve"] = {s: sum(v.values()) / len(v) for s, v in ev.items() if v}
    if len(ev) >= 2:
        first, last = ev[min(ev)], ev[max(ev)]
        out["heldout"] = paired(first, last)
    return out


def run_stats(run: RunData) -> dict[str, Any]:
    """Per run: clip fraction, KL terms, gradient norm, and the swing of one trained token's weight."""
    steps = [m for s, m in sorted(run.metrics.items()) if s in set(run.train_steps)]

    def series(key: str) -> list[float]:
        return [float(m[key]) for m in steps if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]

    out: dict[str, Any] = {"steps": len(steps), "zero_variance": run.zero_variance}
    for name, key in (("clip", "clip/fraction"), ("grad_norm", "grad/norm"), ("lr", "lr")):
        xs = series(key)
        out[f"{name}_mean"], out[f"{name}_max"] = (_mean(xs), max(xs)) if xs else (None, None)
    kls = sorted({k for m in steps for k in m if (k.startswith("kl/") or k == "async/mismatch_kl")})
    out["kl"] = {k: _mean(series(k)) for k in kls}
    tokens = series("learner/tokens")
    out["trained_tokens_min"], out["trained_tokens_max"] = (min(tokens), max(tokens)) if tokens else (None, None)
    out["token_weight_swing"] = max(tokens) / min(tokens) if tokens and min(tokens) > 0 else None
    # Clipped steps: every one moves the weights by the same norm, however few samples it learned from.
    norms, cap = series("grad/norm"), run.max_grad_norm
    out["clipped_steps"] = sum(g > cap for g in norms) if cap and norms else None
    both = [
        (float(m["learner/tokens"]), float(m["grad/norm"])) for m in steps if "learner/tokens" in m and "grad/norm" in m
    ]
    out["tokens_grad_rank_corr"] = spearman([a for a, _ in both], [b for _, b in both])
    return out


def _ranks(xs: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson on ranks, ties averaged); None for fewer than three pairs or a
    constant series."""
    if len(xs) < 3 or len(xs) != len(ys):
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else None


def analyse(runs: list[RunData], warm: int = 5, prior: float = 0.0) -> dict[str, Any]:
    """Every number the report prints: ``{"runs": {label: {...}}, "domains": {domain: {label: {...}}},
    "across": {domain: {...}}}``."""
    domains = sorted({d for r in runs for d in r.domains})
    out: dict[str, Any] = {"runs": {r.label: run_stats(r) for r in runs}, "domains": {}, "across": {}}
    for d in domains:
        per = {}
        for r in runs:
            per[r.label] = (
                signal_stats(r, d)
                | norm_stats(r, d, warm)
                | prior_stats(r, d, prior)
                | advantage_stats(r, d)
                | reward_stats(r, d)
            )
        out["domains"][d] = per
        gains = [p["heldout"]["diff"] for p in per.values() if "heldout" in p]
        out["across"][d] = {
            "k": len(gains),
            "gain_mean": _mean(gains),
            "gain_sd": statistics.stdev(gains) if len(gains) > 1 else None,
            "signal_groups": [p["signal_groups"] for p in per.values()],
        }
    return out


# ---------------------------------------------------------------------------- report


def _f(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _prior_lines(per: dict[str, dict[str, Any]]) -> list[str]:
    """Per run, the running std replayed under ``--prior`` (first value, one-step swings) beside the replay's
    distance from the logged statistic; nothing without ``--prior``."""
    out = []
    for label, p in per.items():
        if "prior_std_first" in p:
            out.append(
                f"{label} with the prior (replayed on its rewards): std first {_f(p['prior_std_first'])}, swing max / "
                f"median {_f(p['prior_swing_max'], '.2f')} / {_f(p['prior_swing_median'], '.2f')} (replay without it "
                f"vs the log: max error {_f(p['replay_error'], '.1e')})"
            )
    return out + ([""] if out else [])


def render(result: dict[str, Any]) -> str:
    """Markdown tables: per domain, one row per run; then the per-run update statistics."""
    from bench._results import table

    lines: list[str] = []
    for d, per in result["domains"].items():
        lines += [f"### {d}", ""]
        head = [
            "run",
            "drawn/step",
            "with signal/step (min)",
            "steps w/o signal",
            "zero-var",
            "signal samples",
            "token share",
            "running std first -> last",
            "swing max / median (after warm)",
            "batch std range",
            "adv std (CV)",
            "train first -> last third",
            "held-out base -> final, gain ± SE",
        ]
        rows = []
        for label, p in per.items():
            h = p.get("heldout")
            held = "-" if h is None else f"{h['a']:.3f} -> {h['b']:.3f}, {h['diff']:+.3f} ± {h['se']:.3f}"
            if h is not None and h["se"] > 0:
                held += f" ({h['diff'] / h['se']:+.1f} SE)"
            rows.append(
                [
                    label,
                    _f(p["drawn_per_step"], ".2f"),
                    f"{_f(p['signal_per_step'], '.2f')} ({_f(p['signal_min'], 'd')})",
                    f"{p['steps_without']} of {p['steps']}",
                    _f(p["zero_variance_fraction"], ".2f"),
                    str(p["signal_samples"]),
                    _f(p["token_share"], ".2f"),
                    f"{_f(p['std_first'])} -> {_f(p['std_last'])}",
                    f"{_f(p['swing_max'], '.2f')} / {_f(p['swing_median'], '.2f')} ({_f(p['swing_max_after_warm'], '.2f')})",
                    f"{_f(p['batch_std_min'], '.2f')}-{_f(p['batch_std_max'], '.2f')}",
                    f"{_f(p['adv_std_mean'], '.2f')} ({_f(p['adv_std_cv'], '.2f')})",
                    f"{_f(p['train_first'])} -> {_f(p['train_last'])}",
                    held,
                ]
            )
        lines += [table(head, rows), ""]
        lines += _prior_lines(per)
        curves = {label: p["curve"] for label, p in per.items() if len(p.get("curve", {})) > 2}
        for label, c in curves.items():
            lines.append(f"{label} held-out curve: " + ", ".join(f"{s}: {v:.3f}" for s, v in c.items()))
        a = result["across"][d]
        lines += [
            f"Across runs: gain {_f(a['gain_mean'], '+.3f')} ± {_f(a['gain_sd'])} (SD, {a['k']} runs); "
            f"groups with signal per run: {a['signal_groups']}.",
            "",
        ]
    head = [
        "run",
        "zero_variance",
        "clip mean / max",
        "KL (mean)",
        "grad norm mean / max",
        "steps clipped",
        "trained tokens min-max",
        "rank corr tokens, grad norm",
    ]
    rows = []
    for label, r in result["runs"].items():
        kl = ", ".join(f"{k} {v:.4f}" for k, v in r["kl"].items() if v is not None) or "not logged"
        tok = f"{_f(r['trained_tokens_min'], '.0f')}-{_f(r['trained_tokens_max'], '.0f')}"
        if r["token_weight_swing"] is not None:
            tok += f" ({r['token_weight_swing']:.1f}x)"
        rows.append(
            [
                label,
                r["zero_variance"],
                f"{_f(r['clip_mean'])} / {_f(r['clip_max'])}",
                kl,
                f"{_f(r['grad_norm_mean'], '.2f')} / {_f(r['grad_norm_max'], '.2f')}",
                "-" if r["clipped_steps"] is None else f"{r['clipped_steps']} of {r['steps']}",
                tok,
                _f(r["tokens_grad_rank_corr"], "+.2f"),
            ]
        )
    lines += ["### updates", "", table(head, rows)]
    return "\n".join(lines)


def run_dirs(paths: list[str], sweep: str) -> list[Path]:
    """The run folders to read: the given ones, then a sweep's ``seed_*`` folders (in seed order)."""
    out = [Path(p) for p in paths]
    if sweep:
        found = sorted(Path(sweep).glob("seed_*"), key=lambda p: (len(p.name), p.name))
        out += [p for p in found if (p / "metrics.jsonl").is_file()]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="run folders (metrics.jsonl, rollouts.jsonl)")
    ap.add_argument("--sweep", default="", help="a bench/seeds.py --out folder: its seed_* runs")
    ap.add_argument("--warm", type=int, default=5, help="steps before the 'after warm-up' normalization swing")
    ap.add_argument("--json", default="", help="also write every number to this file")
    ap.add_argument("--steps", type=int, default=0, help="only train steps 1..N of each run (0 = all)")
    ap.add_argument(
        "--prior", type=float, default=0.0, help="also replay the running std with this algo.reward_norm.prior_samples"
    )
    args = ap.parse_args(argv)
    dirs = run_dirs(args.runs, args.sweep)
    if not dirs:
        print("seed_divergence: error: no run folder given (runs or --sweep)", file=sys.stderr)
        return 2
    try:
        runs = [load_run(p, max_step=args.steps) for p in dirs]
    except ValueError as e:
        print(f"seed_divergence: error: {e}", file=sys.stderr)
        return 2
    labels = [r.label for r in runs]
    for r in runs:  # two runs of one seed (another tree, a repeat): tell them apart by folder
        if labels.count(r.label) > 1:
            r.label = f"{r.label} ({r.path.name})"
    result = analyse(runs, args.warm, args.prior)
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
