"""bench/seed_divergence.py on synthetic run folders: every statistic against a hand computation."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.seed_divergence import analyse, load_run, log_swings, main, render, replayed_stds, spearman  # noqa: E402

# Three train steps, two domains, groups of 2 samples (rewards; tokens per sample in brackets):
#   step 1: code g0 [0, 1] (10 each)  code g1 [0, 0] (10)   tool g2 [1, 1] (5)
#   step 2: code g0 [0, 0] (10)       code g1 [1, 1] (10)   tool g2 [0, 1] (5)
#   step 3: code g0 [1, 0] (20)       code g1 [0, 1] (20)   tool g2 [0.5, 1] (5)
# code: 6 groups drawn, 3 with variance (1, 0, 2 per step), zero-variance 0.5, 6 samples with signal.
# tool: 3 drawn, 2 with variance (0, 1, 1).
# Under drop the trained tokens per step are: 20 (code), 10 (tool), 80 + 10 = 90; code's share 1, 0, 80/90.
GROUPS = {
    1: [("code", 0, [0, 1], 10), ("code", 1, [0, 0], 10), ("tool_call", 2, [1, 1], 5)],
    2: [("code", 0, [0, 0], 10), ("code", 1, [1, 1], 10), ("tool_call", 2, [0, 1], 5)],
    3: [("code", 0, [1, 0], 20), ("code", 1, [0, 1], 20), ("tool_call", 2, [0.5, 1], 5)],
}
CODE_STD = {1: 0.5, 2: 0.4, 3: 0.4}  # running std: swings log(1.25), 0
EVAL = {  # held-out, per step: code tasks a, b; tool task q
    0: {"code": {"a": 0.0, "b": 0.0}, "tool_call": {"q": 0.5}},
    2: {"code": {"a": 1.0, "b": 0.0}, "tool_call": {"q": 0.5}},
    3: {"code": {"a": 1.0, "b": 1.0}, "tool_call": {"q": 1.0}},
}


def make_run(d: Path, seed: int = 0, zero_variance: str = "drop") -> Path:
    d.mkdir(parents=True)
    (d / "recipe.resolved.yaml").write_text(
        f"run: {{seed: {seed}}}\nalgo: {{update: {{zero_variance: {zero_variance}}}, optim: {{max_grad_norm: 1.5}}}}\n"
    )
    roll = []
    for step, groups in GROUPS.items():
        for dom, g, rewards, tok in groups:
            roll += [
                {"step": step, "split": "train", "domain": dom, "group": g, "task_id": f"{dom}{g}", "reward": r}
                | {"reward_error": None, "response_tokens": tok}
                for r in rewards
            ]
    # a sample whose reward errored is no training sample
    roll.append({"step": 1, "split": "train", "domain": "code", "group": 1, "reward": None, "reward_error": "x"})
    for step, ev in EVAL.items():
        roll += [
            {"step": step, "split": "eval", "domain": dom, "task_id": t, "group": 0, "reward": r}
            for dom, per in ev.items()
            for t, r in per.items()
        ]
    (d / "rollouts.jsonl").write_text("\n".join(json.dumps(r) for r in roll) + "\n")
    metrics = [{"step": 0, "eval/reward/mean": 0.1}]
    tokens = {1: 20, 2: 10, 3: 90}
    for s in GROUPS:
        metrics.append(
            {"step": s, "clip/fraction": 0.1 * s, "grad/norm": float(s), "learner/tokens": float(tokens[s])}
            | {"reward/code/running_std": CODE_STD[s], "reward/code/raw_std": 0.25 * s, "reward/code/mean": s / 10}
            | ({"adv/code/std": 1.0 + (s - 1) * 0.5} if s != 2 else {})
            | {"kl/mean": 0.01 * s}
        )
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    return d


def test_signal_per_domain_by_hand(tmp_path):
    run = load_run(make_run(tmp_path / "r"))
    code = analyse([run])["domains"]["code"]["seed 0"]
    assert code["per_step_signal"] == [1, 0, 2]
    assert (code["drawn_per_step"], code["signal_per_step"], code["signal_min"]) == (2.0, 1.0, 0)
    assert code["steps_without"] == 1 and code["signal_groups"] == 3 and code["drawn_groups"] == 6
    assert code["zero_variance_fraction"] == pytest.approx(0.5) and code["signal_samples"] == 6
    assert code["token_share"] == pytest.approx((1 + 0 + 80 / 90) / 3)
    tool = analyse([run])["domains"]["tool_call"]["seed 0"]
    assert tool["per_step_signal"] == [0, 1, 1] and tool["zero_variance_fraction"] == pytest.approx(1 / 3)


def test_kept_zero_variance_groups_count_in_the_token_denominator(tmp_path):
    code = analyse([load_run(make_run(tmp_path / "r", zero_variance="keep"))])["domains"]["code"]["seed 0"]
    # every group's tokens in the step's batch: 20 + 20 + 10, 20 + 20 + 10, 80 + 10
    assert code["token_share"] == pytest.approx((20 / 50 + 0 / 50 + 80 / 90) / 3)


def test_normalization_swing_advantage_scale_and_held_out_by_hand(tmp_path):
    code = analyse([load_run(make_run(tmp_path / "r"))], warm=2)["domains"]["code"]["seed 0"]
    assert (code["std_first"], code["std_last"]) == (0.5, 0.4)
    assert code["swing_max"] == pytest.approx(math.log(1.25))
    assert code["swing_median"] == pytest.approx(math.log(1.25) / 2)
    assert code["swing_max_after_warm"] == pytest.approx(0.0)  # steps 2, 3: 0.4 -> 0.4
    assert (code["batch_std_min"], code["batch_std_max"]) == (0.25, 0.75)
    # adv std 1.0 (step 1) and 2.0 (step 3): mean 1.5, population SD 0.5, CV 1/3
    assert code["adv_std_mean"] == pytest.approx(1.5) and code["adv_std_cv"] == pytest.approx(1 / 3)
    assert code["adv_steps"] == 2
    assert code["train_first"] == pytest.approx(0.1) and code["train_last"] == pytest.approx(0.3)
    h = code["heldout"]  # step 0 -> step 3: diffs 1, 1
    assert (h["a"], h["b"], h["diff"], h["se"], h["n"]) == (0.0, 1.0, 1.0, 0.0, 2)
    assert code["curve"] == {0: 0.0, 2: 0.5, 3: 1.0}


def test_update_statistics_by_hand(tmp_path):
    r = analyse([load_run(make_run(tmp_path / "r"))])["runs"]["seed 0"]
    assert r["clip_mean"] == pytest.approx(0.2) and r["clip_max"] == pytest.approx(0.3)
    assert r["grad_norm_mean"] == pytest.approx(2.0) and r["grad_norm_max"] == 3.0
    assert r["kl"] == {"kl/mean": pytest.approx(0.02)}
    assert (r["trained_tokens_min"], r["trained_tokens_max"], r["token_weight_swing"]) == (10, 90, 9.0)
    assert r["clipped_steps"] == 2  # grad norms 1, 2, 3 over max_grad_norm 1.5
    # tokens 20, 10, 90 (ranks 2, 1, 3) against grad norms 1, 2, 3 (ranks 1, 2, 3): 1 - 6 * (1 + 1 + 0) / (3 * 8)
    assert r["tokens_grad_rank_corr"] == pytest.approx(0.5)


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their mean rank: x ranks 1.5, 1.5, 3; y ranks 1, 2, 3 -> Pearson on ranks = sqrt(3) / 2
    assert spearman([5, 5, 7], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_log_swings():
    assert log_swings([1.0, 2.0, 1.0, 0.0, 3.0]) == pytest.approx([math.log(2), math.log(2)])


def test_across_runs_and_the_printed_report(tmp_path, capsys):
    make_run(tmp_path / "sweep" / "seed_0", seed=0)
    make_run(tmp_path / "sweep" / "seed_1", seed=1)
    out = tmp_path / "div.json"
    assert main(["--sweep", str(tmp_path / "sweep"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert (
        "### code" in text and "| seed 1 |" in text and "1 of 3" in text and "(9.0x)" in text and "| 2 of 3 |" in text
    )
    assert "0.000 -> 1.000, +1.000 ± 0.000" in text and "seed 0 held-out curve: 0: 0.000, 2: 0.500, 3: 1.000" in text
    saved = json.loads(out.read_text())
    assert saved["across"]["code"]["k"] == 2 and saved["across"]["code"]["gain_sd"] == pytest.approx(0.0)
    assert saved["across"]["code"]["signal_groups"] == [3, 3]


def test_two_runs_of_one_seed_are_told_apart(tmp_path, capsys):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    assert main([str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "| seed 0 (a) |" in text and "| seed 0 (b) |" in text


def test_bad_run_folders_are_named(tmp_path, capsys):
    assert main([str(tmp_path / "nothing")]) == 2
    assert "nothing: no metrics.jsonl" in capsys.readouterr().err
    bad = make_run(tmp_path / "bad")
    (bad / "metrics.jsonl").write_text('{"step": 0}\n{not json\n')
    assert main([str(bad)]) == 2
    assert "metrics.jsonl:2: not JSON" in capsys.readouterr().err
    assert main([]) == 2


def test_render_without_held_out_or_normalization(tmp_path):
    d = make_run(tmp_path / "r")
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    text = render(analyse([load_run(d)]))
    assert "| seed 0 |" in text and "- -> -" in text and "not logged" in text


def test_the_first_steps_only(tmp_path, capsys):
    d = make_run(tmp_path / "r")
    code = analyse([load_run(d, max_step=2)])["domains"]["code"]["seed 0"]
    assert code["per_step_signal"] == [1, 0] and code["std_last"] == 0.4 and code["steps"] == 2
    assert code["curve"] == {0: 0.0, 2: 0.5, 3: 1.0}  # held-out evaluations kept whole
    assert main([str(d), "--steps", "1"]) == 0 and "0 of 1" in capsys.readouterr().out


def test_the_running_std_replayed_under_a_prior_by_hand(tmp_path, capsys):
    d = make_run(tmp_path / "r")
    run = load_run(d)
    # code rewards, cumulative: 1 one in 4, 3 in 8, 5 in 12; binary rewards: M2 = n p (1 - p)
    m2 = [4 * 0.25 * 0.75, 8 * (3 / 8) * (5 / 8), 12 * (5 / 12) * (7 / 12)]
    ns = (4, 8, 12)
    assert replayed_stds(run, "code") == pytest.approx([math.sqrt(m / (n - 1)) for m, n in zip(m2, ns)])
    n0 = 4
    expected = [math.sqrt((m + n0 * 0.25) / (n - 1 + n0)) for m, n in zip(m2, ns)]
    assert replayed_stds(run, "code", n0) == pytest.approx(expected)
    p = analyse([run], prior=n0)["domains"]["code"]["seed 0"]
    assert p["prior_std_first"] == pytest.approx(expected[0])
    assert p["prior_swing_max"] == pytest.approx(max(abs(math.log(b / a)) for a, b in zip(expected, expected[1:])))
    # the synthetic log's running std (0.5, 0.4, 0.4) is not the replay's: the check says how far
    assert p["replay_error"] == pytest.approx(math.sqrt(m2[1] / 7) - 0.4)
    assert main([str(d), "--prior", "4"]) == 0
    assert "seed 0 with the prior (replayed on its rewards)" in capsys.readouterr().out
