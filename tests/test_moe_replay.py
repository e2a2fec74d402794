"""Routing replay in the learner (``learner.routing_replay``, docs/moe.md) and its routing metrics.

R2: the update forces the experts the prepare pass recorded, even after the router moved (perturbed here between
the two passes), and the router still gets a gradient. R3: the learner forces the routing the samples carry (the
engine's). The row map lays per-sample routing out as the layouts feed tokens; the metrics match a hand count;
a dense model with replay is refused naming the key.
"""

from __future__ import annotations

import math

import pytest
import torch

from rl.algos.batch import Batch, Sample
from rl.config.recipe import AlgoConfig, LearnerConfig, ModelConfig, OptimConfig, UpdateConfig
from rl.trainer import moe
from rl.trainer.hub import resolve_model
from rollout.routing import routers


@pytest.fixture(scope="module")
def moe_path() -> str:
    return resolve_model("embedded:tiny-moe")


def _batch() -> Batch:
    """Two samples of one prompt (one packed group) and one of another."""
    a = Sample([5, 6, 7, 40, 41, 42, 43], 3, [1, 1, 0, 1], [-1.0] * 4, 1.0, "code", uid=0)
    b = Sample([5, 6, 7, 60, 61], 3, [1, 1], [-1.0] * 2, -1.0, "code", uid=1)
    c = Sample([9, 10, 50, 51, 52], 2, [1, 1, 1], [-1.0] * 3, 0.5, "tool", uid=2, group_id=1)
    return Batch([a, b, c], num_tokens=8, num_seqs=3, domains=("code", "tool"))


def _learner(path: str, tmp_path, replay: str, share_prompt: bool = True, updates: int = 1):
    from rl.trainer.learner import Learner

    upd = UpdateConfig(epochs=updates, minibatches=updates)
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3, max_grad_norm=0.0), update=upd)
    mcfg = ModelConfig(path=path, learner_dtype="float32", autocast=False)
    cfg = LearnerConfig(share_prompt=share_prompt, routing_replay=replay)
    return Learner(path, mcfg, algo, threads=1, shm_dir=str(tmp_path / "shm"), learner=cfg)


def spy_forward(lrn) -> list:
    """Per policy forward of learner ``lrn`` from now on: (samples, forced routing, the experts its experts blocks
    ran as ``(rows, layers, top_k)``, layer after layer per trunk call). Also used by test_moe_replay_e2e.py."""
    calls: list = []
    fwd = lrn._forward
    layers = lrn.model.model.layers

    def spy(model, samples, *a, **k):
        seen: list[torch.Tensor] = []
        hs = [
            layer.mlp.experts.register_forward_pre_hook(lambda _m, args: seen.append(args[1].detach().clone()))
            for layer in layers
        ]
        try:
            out = fwd(model, samples, *a, **k)
        finally:
            for h in hs:
                h.remove()
        if samples:
            ran = torch.stack([torch.cat(seen[i :: len(layers)]) for i in range(len(layers))], dim=1)
            calls.append((list(samples), k.get("routing", a[2] if len(a) > 2 else None), ran))
        return out

    lrn._forward = spy
    return calls


def test_row_map_gather_scatter_round_trip() -> None:
    rows: moe.Rows = [[(0, 0), (1, 0)], [(0, 1), (1, 1)], [(0, 2)], [], [(1, 2)]]
    captured = torch.tensor([[[1, 2]], [[3, 4]], [[5, 6]], [[7, 0]], [[2, 3]]], dtype=torch.uint8)
    per = moe.scatter(captured, rows, [4, 3])
    assert per[0].tolist() == [[[1, 2]], [[3, 4]], [[5, 6]], [[0, 1]]]  # position 3 never fed: default experts
    assert per[1].tolist() == [[[1, 2]], [[3, 4]], [[2, 3]]]
    back = moe.gather(per, rows, (1, 2))
    assert back.tolist() == [[[1, 2]], [[3, 4]], [[5, 6]], [[0, 1]], [[2, 3]]]  # padding: default experts
    with pytest.raises(ValueError, match="position 3"):
        moe.gather([per[0][:3], per[1]], [[(0, 3)]], (1, 2))


def test_routing_stats_against_a_hand_count() -> None:
    # 2 layers, 4 experts, top-2; sample x: 3 tokens (its last is not fed), sample y: 2 tokens (1 fed)
    x = Sample([1, 2, 3], 1, [1, 1], [0.0, 0.0], 0.0, "code")
    y = Sample([1, 2], 1, [1], [0.0], 0.0, "tool")
    rx = torch.tensor([[[0, 1], [2, 3]], [[0, 2], [2, 3]], [[3, 3], [3, 3]]], dtype=torch.uint8)
    ry = torch.tensor([[[1, 0], [0, 1]], [[3, 3], [3, 3]]], dtype=torch.uint8)
    x.routing = torch.tensor([[[1, 0], [2, 3]], [[0, 3], [2, 3]], [[0, 0], [0, 0]]], dtype=torch.uint8)
    st = moe.RoutingStats(layers=2, experts=4)
    st.add([x, y], [rx, ry])
    domains = ("code", "tool")
    m = st.metrics(st.values(domains), domains)
    # layer 0 slots: x (0,1),(0,2), y (1,0): expert 0 x3, 1 x2, 2 x1, 3 x0 of 6
    p = [3 / 6, 2 / 6, 1 / 6]
    assert m["moe/layer_0/entropy"] == pytest.approx(-sum(q * math.log(q) for q in p))
    assert m["moe/layer_0/max_mean"] == pytest.approx(3 / (6 / 4))
    # layer 1: (2,3),(2,3),(0,1): 0,1 once, 2,3 twice
    assert m["moe/layer_1/max_mean"] == pytest.approx(2 / 1.5)
    assert "moe/layer_0/tokens_expert_0" not in m  # per-expert counts only when asked
    assert st.metrics(st.values(domains), domains, per_expert=True)["moe/layer_0/tokens_expert_0"] == 3.0
    # x's engine routing on its 2 fed tokens x 2 layers: token 0 same set both layers, token 1 layer 0 differs
    assert m["moe/routing_disagreement/code"] == pytest.approx(1 / 4)
    assert m["moe/routing_disagreement"] == pytest.approx(1 / 4)
    assert "moe/routing_disagreement/tool" not in m  # y carried no engine routing


def _scramble_routers(model) -> None:
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for r in routers(model):
            r.weight.copy_(torch.randn(r.weight.shape, generator=g) * 0.1)


@pytest.mark.parametrize("share_prompt,updates", [(True, 1), (False, 1), (True, 2)])
def test_r2_update_forces_the_recorded_experts(moe_path, tmp_path, share_prompt, updates, monkeypatch) -> None:
    """``updates``: epochs and minibatches each (2: four optimizer steps over reshuffled minibatches)."""
    from rl.trainer import optim, prepare
    from rollout.routing import capture_routing

    lrn = _learner(moe_path, tmp_path, "r2", share_prompt, updates)
    assert lrn.needs_prepare  # with one on-policy update too: r2 adds the no-grad pass
    rs = routers(lrn.model)
    layers = len(rs)
    state: dict = {}
    run = prepare.run

    def prepare_then_scramble(*a, **k):
        state["prep"] = run(*a, **k)
        state["n"] = len(calls)  # the prepare pass's forwards
        _scramble_routers(lrn.model)  # the update's router now selects other experts on its own
        return state["prep"]

    calls = spy_forward(lrn)
    grads: list[torch.Tensor] = []
    apply = optim.apply

    def spy_apply(params, *a, **k):
        grads.extend(r.weight.grad.detach().clone() for r in rs)
        return apply(params, *a, **k)

    monkeypatch.setattr(prepare, "run", prepare_then_scramble)
    monkeypatch.setattr(optim, "apply", spy_apply)
    try:
        m = lrn.step(_batch())
    finally:
        lrn.shutdown()
    prep, update_calls = state["prep"], calls[state["n"] :]
    assert all(forced is None for _, forced, _ in calls[: state["n"]])  # the prepare pass records, forces nothing
    assert len(update_calls) >= updates * updates
    changed = False
    for samples, forced, ran in update_calls:
        assert forced is not None and all(f is prep.routing[id(s)] for s, f in zip(samples, forced))
        want = moe.gather(forced, lrn.fwd.rows(samples), (layers, rs[0].top_k)).long()
        assert torch.equal(ran, want)
        # without the replay the scrambled router would have chosen other experts for some tokens
        with torch.no_grad(), capture_routing(lrn.model) as cap:
            lrn.fwd(lrn.model, samples)
        changed |= not torch.equal(cap.routing().long().sort(-1).values, want.sort(-1).values)
    assert changed
    assert len(grads) == layers * updates * updates
    assert all(bool(g.isfinite().all()) for g in grads)
    # the router still learns (the first epoch's steps: a later epoch's PPO clip may zero a minibatch's gradient)
    assert all(float(g.abs().sum()) > 0 for g in grads[: layers * updates])
    assert m["moe/layer_0/entropy"] > 0 and m["moe/layer_1/max_mean"] >= 1.0
    assert "moe/routing_disagreement" not in m  # no sample carried engine routing


def test_r3_forces_the_samples_routing_and_disagreement_is_zero(moe_path, tmp_path) -> None:
    batch = _batch()
    g = torch.Generator().manual_seed(1)
    for s in batch.samples:  # an "engine's" routing: two distinct experts per token and layer
        s.routing = (
            torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(len(s.input_ids) * 2)])
            .reshape(len(s.input_ids), 2, 2)
            .to(torch.uint8)
        )
    a, b, _ = batch.samples  # one prompt, run once in the packed layout: the engine routed it the same way
    b.routing[: b.prompt_len] = a.routing[: a.prompt_len]
    lrn = _learner(moe_path, tmp_path, "r3")
    calls = spy_forward(lrn)
    try:
        m = lrn.step(batch)
    finally:
        lrn.shutdown()
    ((samples, forced, ran),) = calls  # one on-policy update, no prepare pass
    assert all(f is s.routing for s, f in zip(samples, forced))
    assert torch.equal(ran, moe.gather(forced, lrn.fwd.rows(samples), (2, 2)).long())
    assert m["moe/routing_disagreement"] == 0.0 and m["moe/routing_disagreement/tool"] == 0.0

    lrn = _learner(moe_path, tmp_path, "none")  # no replay: the learner's own experts differ from random ones
    try:
        m = lrn.step(batch)
    finally:
        lrn.shutdown()
    assert 0.0 < m["moe/routing_disagreement"] <= 1.0


def test_replay_on_a_dense_model_is_refused(tiny_model_path, tmp_path) -> None:
    with pytest.raises(ValueError, match="learner.routing_replay: r2 needs a mixture-of-experts model"):
        _learner(tiny_model_path, tmp_path, "r2")


class _RoutingEngine:
    """Generates ``turns[k]`` at turn k with routing: row t of a turn's routing is ``[t % 200, k]`` (one layer,
    top-2), one row per token it ran (the prompt, then each generated token but the last); ``without``: turns
    that come without routing."""

    def __init__(self, turns: list[list[int]], without: tuple[int, ...] = ()) -> None:
        self.turns, self.without, self.k, self.prompts = turns, without, 0, []

    def generate(self, prompts, sampling, seeds=None, stops=None):
        import numpy as np

        from envs.types import Generation

        k, self.k = self.k, self.k + 1
        self.prompts += [list(p) for p in prompts]
        ids = self.turns[k]
        out = []
        for p in prompts:
            n = len(p) + len(ids) - 1
            r = None if k in self.without else np.array([[[t % 200, k]] for t in range(n)], dtype=np.uint8)
            out.append(Generation(token_ids=list(ids), logprobs=[-0.5] * len(ids), finish_reason="length", routing=r))
        return out


class _VLLMShapedEngine(_RoutingEngine):
    """``_RoutingEngine``'s generations passed through vLLM's request output classes and the vLLM engine's own
    conversion (``rollout.engine._generation``): what the vLLM engine returns under r3 on a GPU."""

    def generate(self, prompts, sampling, seeds=None, stops=None):
        from rollout.engine import _generation
        from test_moe_vllm import _output

        gens = super().generate(prompts, sampling, seeds, stops)
        return [_generation(_output(g.routing, list(p), g.token_ids), ([0], 256)) for p, g in zip(prompts, gens)]


class _TwoTurnEnv:
    """An observation after turn 1, the end after turn 2."""

    def __init__(self) -> None:
        self.turn = 0

    def reset(self, task):
        return list(task.messages)

    def step(self, action):
        from envs.types import Message

        self.turn += 1
        return ([], True, False, {}) if self.turn >= 2 else ([Message("tool", "result 1")], False, False, {})

    def close(self):
        pass


@pytest.mark.parametrize("without", [(), (1,)])
@pytest.mark.parametrize("kind", [_RoutingEngine, _VLLMShapedEngine])
def test_multi_turn_episode_carries_each_tokens_routing_from_the_turn_that_ran_it(
    tiny_tokenizer, without, kind
) -> None:
    from envs.types import Message, Sampling, Task
    from rl.algos.batch import _routing
    from rollout.episode import run_episodes

    tok = tiny_tokenizer
    engine = kind([tok.encode(" one two", add_special_tokens=False), tok.encode(" three")], without)
    t0 = Task(id="t", domain="tool_call", messages=(Message("user", "hi"),))
    (t,) = run_episodes(engine, tok, lambda d: _TwoTurnEnv(), [t0], [0], [1], Sampling(max_turns=3))
    assert t.num_turns == 2 and 0 in t.loss_mask  # the observation's env tokens sit between the turns
    if without:
        assert t.routing is None  # a turn without routing: the episode has none (r3 drops it in build_batch)
        return
    ran1 = len(engine.prompts[0]) + len(engine.turns[0]) - 1  # what turn 1 ran; turn 2 ran the rest
    n = len(t.prompt_ids) + len(t.response_ids)
    assert engine.prompts[1] == (t.prompt_ids + t.response_ids)[: len(engine.prompts[1])]
    assert t.routing.shape == (n - 1, 1, 2)
    assert t.routing[:, 0, 0].tolist() == [p % 200 for p in range(n - 1)]  # row t is token t's
    assert t.routing[:, 0, 1].tolist() == [0] * ran1 + [1] * (n - 1 - ran1)  # from the turn that first ran it
    r = _routing(t)  # the sample's: one row per token, the never-run last one the default experts
    assert r.shape == (n, 1, 2) and r[-1].tolist() == [[0, 1]] and torch.equal(r[:-1], torch.from_numpy(t.routing))


def test_replay_of_experts_far_below_the_routers_choice_keeps_finite_gradients(moe_path) -> None:
    """A router that moved far from the forced experts: their softmax probabilities underflow to 0; the
    renormalised gate weights come from the forced logits' own softmax, not 0 / 0."""
    from transformers import AutoModelForCausalLM

    from rollout.routing import capture_routing, replay_routing

    model = AutoModelForCausalLM.from_pretrained(moe_path, dtype=torch.float32)
    ids = torch.randint(5, 500, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture_routing(model) as cap:
        model(ids)
    forced = (cap.routing().long() + 4) % 8  # other experts than the router's own
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for r in routers(model):
            r.weight.copy_(torch.randn(r.weight.shape, generator=g) * 100.0)  # logits hundreds of nats apart
    with replay_routing(model, forced):
        logits = model(ids).logits
    logits.float().logsumexp(-1).sum().backward()
    assert bool(logits.isfinite().all())
    assert all(bool(r.weight.grad.isfinite().all()) for r in routers(model))


def _routed_traj(reward: float, response: list[int], rows: int | None, group: int = 0):
    """A tool_call trajectory of prompt [5, 6, 7] + ``response`` with ``rows`` rows of random engine routing
    (2 layers, top-2 of 8; None: no routing)."""
    import numpy as np

    from envs.types import Message, Task, Trajectory

    task = Task(id=f"t{group}", domain="tool_call", messages=(Message("user", "hi"),))
    n = len(response)
    g = np.random.default_rng(len(response) * 10 + group)
    routing = None if rows is None else np.stack([g.permutation(8)[:2] for _ in range(rows * 2)]).reshape(rows, 2, 2)
    return Trajectory(
        task, group, [5, 6, 7], response, [1] * n, [-1.0] * n, [], True, False, "stop", reward=reward,
        routing=None if routing is None else routing.astype(np.uint8),
    )  # fmt: skip


def test_r3_drops_a_sample_without_routing_before_the_estimator(moe_path, tmp_path) -> None:
    """Under r3 a trajectory with no engine routing, or routing short of the tokens the engine ran, leaves the
    batch like a harness failure (its GRPO group's baseline is its other members') and is counted in
    ``moe/dropped_no_routing``; the learner's step on the rest equals the step without those trajectories."""
    from rl.algos.batch import build_batch

    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-3, max_grad_norm=0.0))
    ok = [_routed_traj(1.0, [40, 41, 42], 5), _routed_traj(0.0, [50, 51], 4), _routed_traj(0.5, [60, 61], 4, 1)]
    ok.append(_routed_traj(0.0, [62, 63], 4, 1))
    bad = [_routed_traj(1.0, [70, 71], None), _routed_traj(0.0, [72, 73, 74], 3, 1)]  # none; 3 rows of 5 ran
    want, want_stats = build_batch(ok, algo, routing_required=True)
    got, stats = build_batch(ok + bad, algo, routing_required=True)
    assert want_stats["moe/dropped_no_routing"] == 0.0
    assert stats["moe/dropped_no_routing"] == 2.0 and stats["batch/excluded"] == 2.0
    assert [(s.input_ids, s.advantage) for s in got.samples] == [(s.input_ids, s.advantage) for s in want.samples]
    assert (got.num_tokens, got.num_seqs) == (want.num_tokens, want.num_seqs) == (9, 4)
    assert all(s.routing is not None and s.routing.shape[0] == len(s.input_ids) for s in got.samples)
    # without r3 nothing is dropped for routing: the uncovered routing is just not carried (no metric, no error)
    loose, loose_stats = build_batch(ok + bad, algo)
    assert "moe/dropped_no_routing" not in loose_stats and len(loose.samples) == 6
    assert [s.routing is None for s in loose.samples] == [False] * 4 + [True, True]
    losses = []
    for name, batch in (("want", want), ("got", got)):
        lrn = _learner(moe_path, tmp_path / name, "r3")
        try:
            losses.append(lrn.step(batch)["loss/policy"])
        finally:
            lrn.shutdown()
    assert losses[0] == losses[1]
