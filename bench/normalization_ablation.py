"""Ablation: per-domain reward normalization and each domain's share of the policy gradient.

Two domains whose rewards differ 10x in scale (terminal in [0, 10], code in [0, 1]), the
same number of GRPO groups each, on the embedded tiny model. For each shaping mode and estimator
it computes the advantages (rl.algos.shaping.RewardNormalizer after a warm-up of 20 batches, then the estimator), then
the gradient of the clipped policy loss restricted to each domain's samples, and prints
each domain's gradient norm and its share of the sum.

    .venv/bin/python bench/normalization_ablation.py [--groups 8] [--group-size 4] [--seed 0]

`none + dr_grpo` is Dr.GRPO centering (r - group mean, no scaling), where the 10x domain
dominates; `domain + dr_grpo` (the old `domain_then_group`) divides by each domain's running std instead.
"""

from __future__ import annotations

import argparse
import random

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=8, help="groups per domain")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from rl.algos.losses import policy_loss, token_logprobs
    from rl.algos.estimators import get_estimator
    from rl.algos.shaping import RewardNormalizer
    from rl.config.recipe import AlgoConfig
    from rl.trainer.hub import resolve_model

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("embedded:tiny"), dtype=torch.float32)
    V, T, P = model.config.vocab_size, 24, 16
    domains = ["code", "terminal"]
    scale = {"code": 1.0, "terminal": 10.0}

    def batch():
        rewards, groups, doms = [], [], []
        for gi in range(2 * args.groups):
            d = domains[gi % 2]
            rewards += [scale[d] * rng.random() for _ in range(args.group_size)]
            groups += [gi] * args.group_size
            doms += [d] * args.group_size
        return rewards, groups, doms

    rewards, groups, doms = batch()
    B = len(rewards)
    ids = torch.randint(5, V, (B, P + T))
    mask = torch.ones(B, T)

    def grad_norm(adv: torch.Tensor, keep: torch.Tensor) -> float:
        model.zero_grad(set_to_none=True)
        logits = model(ids).logits[:, P - 1 : -1]
        logp = token_logprobs(logits, ids[:, P:])
        loss, _ = policy_loss(logp, logp.detach(), (adv * keep).float(), mask * keep[:, None], num_tokens=B * T)
        loss.backward()
        return float(
            torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
        )

    print(f"{'shaping + estimator':<20} {'|g| code':>10} {'|g| terminal':>13} {'terminal share':>15}")
    for mode, name in (("none", "dr_grpo"), ("none", "grpo"), ("domain", "dr_grpo"), ("domain", "reinforce_pp")):
        norm = RewardNormalizer(mode)
        for _ in range(20):  # warm the running statistics up
            r, _, d = batch()
            norm.shape(r, d)
        shaped = norm.shape(rewards, doms)
        scores = shaped if shaped is not None else torch.tensor(rewards, dtype=torch.float64)
        adv = get_estimator(AlgoConfig(name=name)).outcome(scores, torch.tensor(groups))
        gn = {d: grad_norm(adv, torch.tensor([x == d for x in doms], dtype=torch.float64)) for d in domains}
        share = gn["terminal"] / (gn["terminal"] + gn["code"])
        label = f"{mode} + {name}"
        print(f"{label:<20} {gn['code']:>10.4f} {gn['terminal']:>13.4f} {share:>15.2f}")


if __name__ == "__main__":
    main()
