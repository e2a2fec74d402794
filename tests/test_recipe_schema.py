"""The recipe schema per algorithm (rl/config/algo.py): an estimator's own settings exist only in its arm of the
``algo`` union, defaults are resolved once, every old key names a new place that loads, the task files are
loaded once for all their checks, and knob docs carry no host measurements."""

from __future__ import annotations

import dataclasses
import functools
import pickle
import re
from pathlib import Path

import pytest

from rl.algos.estimators import ESTIMATORS
from rl.config.algo import (
    AlgoConfig,
    CISPOLossConfig,
    DiscountConfig,
    GroupAlgoConfig,
    GSPOLossConfig,
    LossConfig,
    PPOClipLossConfig,
    PPOConfig,
    ReinforcePPConfig,
    ReturnsConfig,
    UserAlgoConfig,
    UserLossConfig,
    algo_arm,
    loss_arm,
    loss_arms,
    tags_of,
)
from rl.config.docgen import field_docs, recipe_reference
from rl.config.fields import FieldError
from rl.config.migrations import OLD_NORMALIZATIONS, RENAMED
from rl.config.recipe import Recipe, RecipeError, load_recipe, recipe_to_dict, validate_recipe

REPO = Path(__file__).resolve().parents[1]


def _load(tmp_path: Path, text: str, overrides: list[str] | None = None) -> Recipe:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return load_recipe(p, overrides or [])


def _error(tmp_path: Path, text: str, overrides: list[str] | None = None) -> str:
    with pytest.raises(RecipeError) as e:
        _load(tmp_path, text, overrides)
    return str(e.value)


def test_each_registered_estimator_has_its_arm() -> None:
    for name, est in ESTIMATORS.items():
        arm = algo_arm(name)
        assert name in tags_of(arm) and type(AlgoConfig(name=name)) is arm
        shared = {f.name for f in dataclasses.fields(AlgoConfig)}
        own = {f.name for f in dataclasses.fields(arm)} - shared
        assert own == set(est.sections), f"{name}: the arm's own sections {own} are not {est.sections}"
    assert algo_arm("my_pkg.mod.Estimator") is UserAlgoConfig
    assert isinstance(AlgoConfig(), GroupAlgoConfig) and AlgoConfig().name == "grpo"
    assert type(AlgoConfig(name="rloo")) is GroupAlgoConfig and AlgoConfig(name="rloo").name == "rloo"
    ppo = AlgoConfig(name="ppo", returns=ReturnsConfig(lam=0.9))
    assert isinstance(ppo, PPOConfig) and ppo.returns.lam == 0.9 and ppo.critic.vf_coef == 0.5
    assert dataclasses.replace(ppo, kl=ppo.kl) == ppo  # replace keeps the arm
    with pytest.raises(TypeError, match="critic"):
        AlgoConfig(name="grpo", critic=ppo.critic)  # type: ignore[call-arg]
    with pytest.raises(FieldError, match="returns: expected a DiscountConfig section"):
        ReinforcePPConfig(returns=LossConfig())  # type: ignore[arg-type]
    with pytest.raises(FieldError, match="name: unknown algorithm 'a2c'"):
        AlgoConfig(name="a2c")
    with pytest.raises(FieldError, match="ppo has settings of its own"):
        UserAlgoConfig(name="ppo")


@pytest.mark.parametrize(
    "text, overrides, expected",
    [
        (
            "algo:\n  name: grpo\n  critic:\n    vf_coef: 1\n",
            [],
            [
                "r.yaml:3",
                "unknown recipe key 'algo.critic' (algo.name grpo has no critic: it is a setting of ppo and an "
                "estimator named by dotted path); valid keys here: name, optim, loss, kl, update, reward_norm",
            ],
        ),
        (
            "train:\n  steps: 2\n",
            ["algo.returns.gamma=0.9"],
            ["override 'algo.returns.gamma=0.9'", "unknown recipe key 'algo.returns'", "reinforce_pp, ppo and"],
        ),
        (
            "algo:\n  name: reinforce_pp\n  returns: {gamma: 0.9, lam: 0.9}\n",
            [],
            [
                "r.yaml:3",
                "unknown recipe key 'algo.returns.lam' (GAE's lambda: a setting of ppo); valid keys here: gamma",
            ],
        ),
        ("algo:\n  name: dr_grpo\n  kwargs: {a: 1}\n", [], ["r.yaml:3", "unknown recipe key 'algo.kwargs'"]),
        ("mixer:\n  mode: sometimes\n", [], ["r.yaml:2", "mixer.mode: choose one of fixed, adaptive; got 'sometimes'"]),
    ],
)
def test_another_algorithms_setting_is_an_unknown_key(tmp_path: Path, text, overrides, expected) -> None:
    msg = _error(tmp_path, text, overrides)
    for frag in expected:
        assert frag in msg, msg


def test_an_algorithms_own_settings_load_with_it(tmp_path: Path) -> None:
    a = _load(tmp_path, "algo:\n  name: ppo\n  critic: {vf_coef: 1}\n  returns: {lam: 0.9}\n").algo
    assert isinstance(a, PPOConfig) and (a.critic.vf_coef, a.returns.lam, a.returns.gamma) == (1.0, 0.9, 1.0)
    a = _load(tmp_path, "algo:\n  name: reinforce_pp\n  returns: {gamma: 0.9}\n").algo
    assert isinstance(a, ReinforcePPConfig) and type(a.returns) is DiscountConfig and a.returns.gamma == 0.9
    keys = set(recipe_to_dict(_load(tmp_path, "algo: {name: ppo}\n"))["algo"])
    assert keys == {"name", "optim", "loss", "kl", "update", "reward_norm", "critic", "returns"}
    assert set(recipe_to_dict(_load(tmp_path, "train: {steps: 1}\n"))["algo"]) == keys - {"critic", "returns"}


def test_a_user_estimator_reads_only_the_sections_it_declares(recipe_copy, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "user_est.py").write_text(
        "from rl.algos.estimators import GRPO\n\n"
        "class Plain(GRPO):\n    pass\n\n"
        "class WithReturns(GRPO):\n    sections = ('returns',)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = recipe_copy("tiny.yaml", filename="r.yaml")
    validate_recipe(load_recipe(recipe, ["algo.name=user_est.WithReturns", "algo.returns.gamma=0.5"]))
    with pytest.raises(RecipeError) as e:
        validate_recipe(load_recipe(recipe, ["algo.name=user_est.Plain", "algo.returns.gamma=0.5"]))
    assert ": algo.returns: user_est.Plain does not read it" in str(e.value), str(e.value)


def test_loss_agg_auto_is_resolved_once_when_the_algo_section_is_built() -> None:
    from rl.trainer.learner import _loss_aggregation

    assert AlgoConfig(name="grpo").loss.agg == "token-mean"
    assert AlgoConfig(name="dr_grpo").loss.agg == "seq-mean-token-sum-norm"
    assert AlgoConfig(name="dr_grpo", loss=LossConfig(agg="token-mean")).loss.agg == "token-mean"  # explicit stays
    # The learner reads the resolved value; the generation budget fills norm_tokens in the Recipe.
    algo = AlgoConfig(name="dr_grpo", loss=LossConfig(norm_tokens=16))
    assert _loss_aggregation(algo) == ("seq-mean-token-sum-norm", 16)
    assert Recipe(algo=AlgoConfig(name="dr_grpo")).algo.loss.norm_tokens == 64  # rollout.max_new_tokens x 1 turn
    assert Recipe(algo=AlgoConfig(name="grpo")).algo.loss.norm_tokens == 0
    # No other module resolves it: default_agg is read only by the algo arms.
    readers = [
        str(p.relative_to(REPO))
        for root in ("rl", "rollout", "rewards")
        for p in (REPO / root).rglob("*.py")
        if "default_agg" in p.read_text()
    ]
    assert sorted(readers) == ["rl/algos/estimators.py", "rl/config/algo.py"], readers


def _nested(dotted: str, value) -> dict:
    out: dict = {}
    node = out
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_every_old_key_names_its_new_place_which_loads(tmp_path: Path, old: str, new: str) -> None:
    import yaml

    algo = "ppo" if new.startswith(("algo.critic", "algo.returns")) else "grpo"
    value = functools.reduce(dict.__getitem__, new.split("."), recipe_to_dict(Recipe(algo=AlgoConfig(name=algo))))
    with_name = lambda d: {**d, "algo": {"name": algo, **d.get("algo", {})}}  # noqa: E731
    msg = _error(tmp_path, yaml.safe_dump(with_name(_nested(old, value))))
    assert "r.yaml:" in msg and "moved to" in msg and new in msg, msg
    cfg = _load(tmp_path, yaml.safe_dump(with_name(_nested(new, value))))
    assert functools.reduce(dict.__getitem__, new.split("."), recipe_to_dict(cfg)) == value


@pytest.mark.parametrize("old", sorted(OLD_NORMALIZATIONS))
def test_old_normalizations_name_what_gives_them_now(tmp_path: Path, old: str) -> None:
    msg = _error(tmp_path, f"mixer:\n  normalization: {old}\n")
    assert "r.yaml:2" in msg and "moved to 'algo.reward_norm.mode'" in msg and OLD_NORMALIZATIONS[old] in msg


def test_task_files_are_loaded_once_for_all_their_checks(recipe_copy, monkeypatch) -> None:
    import envs.io

    cfg = load_recipe(recipe_copy("tiny.yaml"))
    calls: list[Path] = []
    real = envs.io.load_tasks
    monkeypatch.setattr(envs.io, "load_tasks", lambda p, *a, **k: calls.append(Path(p)) or real(p, *a, **k))
    validate_recipe(cfg, task_domains=True)
    files = [*cfg.data.train_files, *cfg.data.eval_files]
    assert len(files) == 2 and sorted(calls) == sorted(Path(f) for f in files)


def test_the_reference_lists_each_arm_with_its_own_keys() -> None:
    text = recipe_reference()
    for heading in ("`algo` with `name: ppo` (PPOConfig)", "`algo` with `name: pkg.module.Class` (UserAlgoConfig)"):
        assert heading in text
    rows = {line.split("|")[1].strip().strip("`") for line in text.splitlines() if line.startswith("| `")}
    assert {"algo.critic.vf_coef", "algo.returns.lam", "algo.returns.gamma", "algo.kwargs", "algo.name"} <= rows
    assert ("PPOConfig", "critic") in field_docs() and ("DiscountConfig", "gamma") in field_docs()


def test_knob_docs_say_what_a_knob_does_not_what_a_host_measured() -> None:
    # Speed-ups, A/B results and hosts (the old docs of model.autocast, learner.allocator, learner.hold_memory ...).
    measured = re.compile(
        r"\dx (faster|slower|the step)|\dx generation|RESULTS\.md|\bZen\d?\b|AVX|\d s vs\b|[+-]\d+% (in|on)\b|step -\d+%"
    )
    bad = {k: d for k, d in field_docs().items() if measured.search(d)}
    assert not bad, bad


class _Reads:
    """An ``algo.loss`` section that records which of its keys are read."""

    def __init__(self, cfg: LossConfig) -> None:
        self._cfg, self.read = cfg, set()

    def __getattr__(self, key: str):
        self.read.add(key)
        return getattr(self._cfg, key)


def test_each_registered_loss_has_its_arm_with_the_keys_it_reads() -> None:
    import torch

    from rl.algos.policy_losses import LOSSES, LossInputs

    shared = {f.name for f in dataclasses.fields(LossConfig)}
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=g, dtype=torch.float64).requires_grad_()
    x = LossInputs(
        logp=logp,
        old_logp=logp.detach() + 0.3 * torch.randn(3, 5, generator=g, dtype=torch.float64),
        advantages=torch.randn(3, 5, generator=g, dtype=torch.float64),
        mask=torch.rand(3, 5, generator=g) > 0.2,
        agg="token-mean",
        num_tokens=15.0,
        num_seqs=3.0,
        engine_logp=logp.detach() - 0.1,
    )
    for name, cls in LOSSES.items():
        arm = loss_arm(name)
        assert arm is cls.settings and name in tags_of(arm) and type(LossConfig(policy=name)) is arm
        own = {f.name for f in dataclasses.fields(arm)} - shared
        # every own setting switched on (a knob > 1 suits dual_clip, tis_cap and the clips alike; the IS mask's
        # band is [0.5, 1.5], its level the sequence)
        on = {"clip_low": 0.5, "mis_low": 0.5, "is_level": "sequence"}
        cfg = _Reads(dataclasses.replace(arm(), **{k: on.get(k, 1.5) for k in own}))
        loss = cls(cfg)
        loss(x)
        _ = loss.stat_names, loss.needs
        assert cfg.read - shared == own, f"{name} reads {cfg.read - shared}; its arm has {own}"
    assert loss_arm("my_pkg.mod.Loss") is UserLossConfig and loss_arm(3) is UserLossConfig
    assert type(LossConfig()) is PPOClipLossConfig and LossConfig().policy == "ppo_clip"
    assert pickle.loads(pickle.dumps(LossConfig(policy="cispo", tis_cap=2.0))) == CISPOLossConfig(tis_cap=2.0)
    with pytest.raises(FieldError, match="cispo has settings of its own"):
        UserLossConfig(policy="cispo")
    with pytest.raises(FieldError, match=r"clip_low: unknown key \(algo.loss.policy cispo has no clip_low"):
        LossConfig(policy="cispo", clip_low=0.1)


_COMMON = "policy, agg, norm_tokens, entropy_coef, aux_coef"


@pytest.mark.parametrize(
    "text, overrides, expected",
    [
        (
            "algo:\n  loss:\n    policy: gspo\n    dual_clip: 3\n",
            [],
            [
                "r.yaml:4",
                "unknown recipe key 'algo.loss.dual_clip' (algo.loss.policy gspo has no dual_clip: it is a setting "
                f"of ppo_clip and decoupled_ppo); valid keys here: {_COMMON}, clip_low, clip_high",
            ],
        ),
        (
            "algo:\n  name: dr_grpo\n  loss: {clip_low: 0.1, policy: cispo}\n",
            [],
            [
                "r.yaml:3",
                "(algo.loss.policy cispo has no clip_low: it is a setting of ppo_clip, gspo and decoupled_ppo)",
            ],
        ),
        (
            "algo:\n  loss: {policy: gspo}\n",
            ["algo.loss.tis_cap=2"],
            ["override 'algo.loss.tis_cap=2'", "it is a setting of ppo_clip, cispo and decoupled_ppo"],
        ),
        (
            "algo:\n  loss:\n    clip_high: 0.28\n    kwargs: {beta: 1}\n",
            [],
            ["r.yaml:4", "(algo.loss.policy ppo_clip has no kwargs: it is a setting of a loss named by dotted path)"],
        ),
        (
            "algo:\n  loss:\n    policy: pkg_xyz.Loss\n    clip_high: 0.28\n",
            [],
            ["r.yaml:4", "unknown recipe key 'algo.loss.clip_high' (algo.loss.policy: cannot import"],
        ),
        (
            "algo:\n  loss:\n    policy: cispo\n    clip_high: -1\n",
            [],
            ["r.yaml:4", "algo.loss.clip_high: must be >= 0, got -1"],
        ),
    ],
)
def test_another_losss_setting_is_an_unknown_key(tmp_path: Path, text, overrides, expected) -> None:
    msg = _error(tmp_path, text, overrides)
    for frag in expected:
        assert frag in msg, msg


def test_a_losss_own_settings_load_with_it_and_print_complete(tmp_path: Path) -> None:
    import yaml

    for text, arm, own in (
        ("algo:\n  loss: {clip_high: 0.28, dual_clip: 3}\n", PPOClipLossConfig, {"dual_clip": 3.0}),
        ("algo:\n  loss: {policy: gspo, clip_low: 3.0e-4, clip_high: 4.0e-4}\n", GSPOLossConfig, {"clip_low": 3e-4}),
        ("algo:\n  name: ppo\n  loss: {policy: cispo, tis_cap: 2}\n", CISPOLossConfig, {"tis_cap": 2.0}),
    ):
        cfg = _load(tmp_path, text)
        assert type(cfg.algo.loss) is arm and all(getattr(cfg.algo.loss, k) == v for k, v in own.items())
        printed = recipe_to_dict(cfg)  # what validate --print shows: every key of the arm, none of another
        assert list(printed["algo"]["loss"]) == [f.name for f in dataclasses.fields(arm)]
        again = _load(tmp_path, yaml.safe_dump({k: v for k, v in printed.items() if k != "source"}))
        assert again.algo == cfg.algo  # the printed recipe loads as the same recipe


def test_the_reference_lists_each_losss_keys() -> None:
    text = recipe_reference()
    for arm in loss_arms():
        tags = " | ".join(tags_of(arm)) or "pkg.module.Class"
        part = text.split(f"#### `algo.loss` with `policy: {tags}` ({arm.__name__})", 1)[1].split("\n#", 1)[0]
        rows = {line.split("|")[1].strip().strip("`") for line in part.splitlines() if line.startswith("| `")}
        shared = {f.name for f in dataclasses.fields(LossConfig)}
        assert rows == {f"algo.loss.{f.name}" for f in dataclasses.fields(arm) if f.name not in shared}, arm
