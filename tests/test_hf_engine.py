"""``rollout.hf_engine.HFEngine``: the in-process engine of ``LocalRuntime`` (tiny model, CPU)."""

from __future__ import annotations

import pytest
import torch

from envs.types import Sampling
from rollout.hf_engine import HFEngine, _pick


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    return HFEngine(tiny_model_path, dtype="float32")


def test_a_request_depends_on_its_seed_only(engine) -> None:
    s = Sampling(12, 1.0, 1.0, 1, 256)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    a = engine.generate(prompts, s, seeds=[10, 11, 12])
    b = engine.generate(prompts[::-1], s, seeds=[12, 11, 10])[::-1]
    assert [g.token_ids for g in a] == [g.token_ids for g in b], "batch order does not change a sample"
    c = engine.generate(prompts, s, seeds=[13, 14, 15])
    assert [g.token_ids for g in a] != [g.token_ids for g in c], "another seed, another sample"
    for g in a:
        assert len(g.logprobs) == len(g.token_ids) and all(lp <= 0 for lp in g.logprobs)
        assert g.finish_reason in ("stop", "length")


def test_logprobs_are_the_models_and_room_is_checked(engine) -> None:
    s = Sampling(6, 0.0, 1.0, 1, 256)
    g = engine.generate([[1, 2, 3]], s, seeds=[0])[0]
    assert engine.score([1, 2, 3], g.token_ids) == pytest.approx(g.logprobs, abs=1e-5)
    with pytest.raises(ValueError, match="prompt 0 has 4 tokens, no room under max_model_len=4"):
        engine.generate([[1, 2, 3, 4]], Sampling(6, 0.0, 1.0, 1, 4))


def test_top_p_keeps_the_smallest_prefix() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    gen = torch.Generator().manual_seed(0)
    picks = {_pick(logits, Sampling(1, 1.0, 0.7, 1, 8), gen)[0] for _ in range(300)}
    assert picks == {0, 1}, "0.5 + 0.3 reaches top_p=0.7; the tail is never drawn"
    assert _pick(logits, Sampling(1, 0.0, 1.0, 1, 8), gen)[0] == 0, "temperature 0 is greedy"


def test_pick_returns_the_logprob_of_the_distribution_it_sampled() -> None:
    """Tempered and nucleus-renormalised, computed independently here: p_T = p^(1/T) / Z, then / (p_T(0) + p_T(1))."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    logits = torch.log(p).float()
    gen = torch.Generator().manual_seed(0)
    pt = p ** (1 / 0.7) / (p ** (1 / 0.7)).sum()
    for _ in range(20):
        tok, lp = _pick(logits, Sampling(1, 0.7, 1.0, 1, 8), gen)
        assert lp == pytest.approx(float(torch.log(pt[tok])), abs=1e-5)
        tok, lp = _pick(logits, Sampling(1, 0.7, 0.7, 1, 8), gen)  # nucleus {0, 1}: 0.59 + 0.29 >= 0.7
        assert tok in (0, 1)
        assert lp == pytest.approx(float(torch.log(pt[tok] / pt[:2].sum())), abs=1e-5)
    tok, lp = _pick(logits, Sampling(1, 0.0, 1.0, 1, 8), gen)
    assert (tok, lp) == (0, pytest.approx(float(torch.log(p[0])), abs=1e-6)), "greedy: the raw log-prob"


def test_load_weights_checks_the_names(engine, tmp_path) -> None:
    from safetensors.torch import save_file

    sd = {k: v.clone() for k, v in engine.model.state_dict().items()}
    save_file({**sd, "extra.weight": torch.zeros(1)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(KeyError, match="extra.weight"):
        engine.load_weights(str(tmp_path / "x.safetensors"))
