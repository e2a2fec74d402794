"""The ``algo`` section: a tagged union on ``algo.name``, one arm per advantage estimator, and within it
``algo.loss``, a tagged union on ``algo.loss.policy``, one arm per policy loss.

Every arm has the shared sub-sections (``optim``, ``loss``, ``kl``, ``update``, ``reward_norm``);
an estimator's own settings exist only in its arm: ``algo.critic`` and GAE's ``algo.returns.lam``
only with ``ppo``, ``algo.returns.gamma`` with ``reinforce_pp`` and ``ppo``, ``algo.kwargs`` only
with an estimator named by dotted path (``UserAlgoConfig``, which also carries ``critic`` and
``returns`` for a user class that declares them in its ``sections``). A key of another arm is an
unknown recipe key, named with its line like any other, and the error says which algorithms have it.

Likewise a policy loss's own settings exist only in its arm of ``algo.loss``: ``clip_low`` with ppo_clip,
gspo and decoupled_ppo, ``clip_high`` with all four shipped losses, ``dual_clip`` with ppo_clip and
decoupled_ppo, ``tis_cap`` and the IS-correction keys (``is_level``, ``mis_low``, ``mis_high``) with
ppo_clip, cispo and decoupled_ppo, ``kwargs`` with a loss named by dotted path that declares no settings of its own
(``UserLossConfig``). A user's loss declares its settings in its own file: its class's ``settings``, a
``LossConfig`` subclass, is then its arm (``loss_arm`` imports the class to find it). The keys every loss
has (``agg``, ``norm_tokens``, ``entropy_coef``, ``aux_coef``) are the union's own. Each policy loss class
(``rl.algos.policy_losses``) names its arm in ``settings``; a test checks that each registered loss and
its arm agree.

``AlgoConfig(name=..., ...)`` builds the arm ``name`` chooses (``PPOConfig`` for ``ppo``, ...),
so code builds an algorithm's settings as a recipe does; ``build`` picks the arm the same way
(``Section.arm_for``); ``LossConfig(policy=...)`` likewise. Each algo arm resolves ``algo.loss.agg: auto``
to its estimator's own aggregation (``Estimator.default_agg``) when it is built, the one place that default
is resolved: every reader (the learner, the policy losses, ``validate --print``) sees the resolved value.

The tags are the names of the estimator registry (``rl.algos.estimators.ESTIMATORS``); the group
baselines (grpo, dr_grpo, rloo), which have no settings of their own, share one arm. A test checks
that each registered estimator has its arm and that the arm's own sections are the ones the
estimator declares (``Estimator.sections``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import typing
from typing import Any, ClassVar, Literal

from rl.config.fields import FieldError, Section, hints, knob

__all__ = [
    "OptimConfig",
    "LossAgg",
    "LossConfig",
    "PPOClipLossConfig",
    "GSPOLossConfig",
    "CISPOLossConfig",
    "DecoupledPPOLossConfig",
    "UserLossConfig",
    "loss_arm",
    "loss_arms",
    "KLConfig",
    "CriticConfig",
    "DiscountConfig",
    "ReturnsConfig",
    "UpdateConfig",
    "RewardNormConfig",
    "AlgoConfig",
    "GroupAlgoConfig",
    "ReinforcePPConfig",
    "PPOConfig",
    "UserAlgoConfig",
    "algo_arm",
    "algo_arms",
    "tags_of",
    "TaggedUnion",
    "UnknownKeyError",
]


def _arm_hint(union: type, arms: list[type], cls: type, key: str, data: dict, default: str, user: str) -> str:
    """`` (<tag> X has no KEY: it is a setting of A and B)`` when other arms of ``union`` have ``key``, else ""."""
    have = [" and ".join(tags_of(arm)) or user for arm in arms if key in _own_fields(arm, union)]
    if not have:
        return ""
    this = f"{union.where}.{union.tag} {data.get(union.tag, default)}" if tags_of(cls) else user
    listed = ", ".join(have[:-1]) + (" and " if len(have) > 1 else "") + have[-1]
    return f" ({this} has no {key}: it is a setting of {listed})"


def tags_of(arm: type) -> tuple[str, ...]:
    """The names an arm of a union is for: its tag field's ``Literal[...]`` (``algo.name``, ``algo.loss.policy``;
    none for a dotted-path arm)."""
    return typing.get_args(hints(arm)[arm.tag])


def _own_fields(arm: type, union: type) -> list[str]:
    """The fields ``arm`` has beyond the ones every arm of ``union`` has."""
    shared = {f.name for f in dataclasses.fields(union)}
    return [f.name for f in dataclasses.fields(arm) if f.name not in shared]


class UnknownKeyError(FieldError, TypeError):
    """A key the arm does not have, given in code (``AlgoConfig(name=NAME, critic=...)``): the recipe's message,
    and a ``TypeError`` as a dataclass's own refusal of an unexpected keyword argument is."""


class TaggedUnion(Section):
    """Base of a section that is a tagged union: the class itself chooses an arm (a subclass) by the value of its
    ``tag`` key, when built from a recipe (``arm_for``) and when constructed in code (``__new__``); a key only
    other arms have is unknown, with the words of ``key_hint``. The union declares, as class keywords, its ``tag``
    key, ``where`` it sits, the ``default`` tag and how errors name its dotted-path arm (``user``), and
    implements ``arm_of`` and ``all_arms``."""

    tag: ClassVar[str] = "name"
    where: ClassVar[str] = ""
    default_tag: ClassVar[str] = ""
    user: ClassVar[str] = ""
    _is_union: ClassVar[bool] = False

    def __init_subclass__(cls, tag: str = "", where: str = "", default: str = "", user: str = "", **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if tag:  # the union itself; its arms (subclasses) name no tag
            cls.tag, cls.where, cls.default_tag, cls.user, cls._is_union = tag, where, default, user, True

    @classmethod
    def union(cls) -> type[TaggedUnion]:
        """The union itself (the class that declared its ``tag``), from any of its arms."""
        return next(c for c in cls.__mro__ if c.__dict__.get("_is_union"))

    @classmethod
    def arm_of(cls, tag: Any) -> type:
        raise NotImplementedError

    @classmethod
    def all_arms(cls) -> list[type]:
        raise NotImplementedError

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        union = cls.union()
        if cls is union:  # the union itself: build the arm that the tag chooses
            cls = union.arm_of(kwargs.get(union.tag, args[0] if args else union.default_tag))
            names = [f.name for f in dataclasses.fields(cls)]
            for k in kwargs:
                if k not in names:
                    raise UnknownKeyError(k, f"unknown key{cls.key_hint(k, kwargs)}; valid keys: {', '.join(names)}")
        return super().__new__(cls)

    @classmethod
    def arms(cls) -> list[type]:
        """The arms of the union (on the union itself; an arm has none)."""
        return cls.all_arms() if cls is cls.union() else []

    @classmethod
    def arm_for(cls, data: dict) -> type:
        return cls.arm_of(data.get(cls.tag, cls.default_tag)) if cls is cls.union() else cls

    @classmethod
    def key_hint(cls, key: str, data: dict) -> str:
        return _arm_hint(cls.union(), cls.all_arms(), cls, key, data, cls.default_tag, cls.user)


@dataclass(frozen=True)
class OptimConfig(Section):
    """AdamW and its learning-rate schedule (the place for further optimizer choices)."""

    lr: float = knob(1e-5, "AdamW learning rate of the policy", gt=0)
    weight_decay: float = knob(0.0, "AdamW weight decay", ge=0)
    max_grad_norm: float = knob(1.0, "global-norm clipping (0 = off)", ge=0)
    warmup_steps: int = knob(0, "optimizer steps of linear warmup", ge=0)
    schedule: Literal["constant", "cosine"] = knob(
        "constant", "after warmup: constant | cosine (to lr * min_lr_ratio at the last step)"
    )
    min_lr_ratio: float = knob(0.0, "cosine floor, as a fraction of lr", ge=0, le=1)


LossAgg = Literal["auto", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

DEFAULT_LOSS = "ppo_clip"  # algo.loss.policy when a recipe leaves it out


@dataclass(frozen=True)
class LossConfig(
    TaggedUnion, tag="policy", where="algo.loss", default=DEFAULT_LOSS, user="a loss named by dotted path"
):
    """The policy loss and the settings every loss has (aggregation, the entropy and auxiliary terms); a
    loss's own settings are in its arm (below), chosen by ``policy``. ``LossConfig(policy=...)`` builds
    the arm of that loss."""

    policy: str = knob(
        DEFAULT_LOSS,
        "the policy loss (rl/algos/policy_losses.py): ppo_clip (clipped surrogate: clip-higher, dual clip, TIS) | "
        "gspo (sequence-level ratio) | cispo (clipped stop-gradient IS weight) | decoupled_ppo (AReaL: clip "
        "against the proximal policy, IS weight proximal / engine) | a dotted path "
        "pkg.module.Class of a PolicyLoss subclass (docs/algorithms.md); it decides which further keys "
        "algo.loss has (below)",
        check=lambda v: None if v else "a policy loss name is needed",
    )
    agg: LossAgg = knob(
        "auto",
        "auto (the estimator's own: token-mean; dr_grpo: seq-mean-token-sum-norm) | token-mean | "
        "seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm (sum / norm_tokens)",
    )
    norm_tokens: int = knob(
        0,
        "constant token normalizer of seq-mean-token-sum-norm (0 = rollout.max_new_tokens x "
        "rollout.max_turns, the generation budget, as in the Dr.GRPO paper)",
        ge=0,
    )
    entropy_coef: float = knob(0.0, "entropy bonus weight (0 = off)", ge=0)
    aux_coef: float = knob(
        0.0,
        "weight of the model's auxiliary loss from its outputs: an MoE's router load-balancing loss "
        "(rl/algos/router.py; transformers' router_aux_loss_coef, 0.001 for Qwen3-MoE); a dense model refuses it "
        "(0 = off)",
        ge=0,
    )

    @classmethod
    def arm_of(cls, tag: Any) -> type:
        return loss_arm(tag)

    @classmethod
    def all_arms(cls) -> list[type]:
        return loss_arms()

    @classmethod
    def key_hint(cls, key: str, data: dict) -> str:
        hint = super().key_hint(key, data)
        if hint or cls in loss_arms():
            return hint
        return f" ({data.get('policy')} declares its keys in {cls.__module__}.{cls.__qualname__})"


def _clip_low() -> Any:
    return knob(0.2, "ratio clip below 1", ge=0, lt=1)


def _clip_high(doc: str = "ratio clip above 1 (clip-higher when > clip_low)") -> Any:
    return knob(0.2, doc, ge=0)


def _tis_cap() -> Any:
    return knob(
        0.0,
        "truncated importance sampling: each token's loss x min(pi_learner / pi_engine, tis_cap) (at is_level), "
        "correcting for stale (async) or numerically different engine samples (0 = off)",
        ge=0,
    )


def _is_level() -> Any:
    return knob(
        "token",
        "level of the engine IS weight that tis_cap and mis_low/mis_high act on: token (pi_learner / pi_engine "
        "per token) | sequence (their product over the sequence's policy tokens, one weight per sequence)",
    )


def _mis_low() -> Any:
    return knob(
        0.0,
        "masked IS: a token (sequence, with is_level: sequence) whose engine IS weight is below this gets weight 0; "
        "with mis_high a two-sided mask as IcePop's [0.5, 5] (0 = no lower bound)",
        ge=0,
    )


def _mis_high() -> Any:
    return knob(
        0.0,
        "masked IS: a token (sequence) whose engine IS weight is above this gets weight 0, the others keep theirs "
        "(0 = no upper bound; both 0 = no mask)",
        ge=0,
    )


class _ISChecks:
    """The rule between the IS-correction keys an arm has (``mis_low`` < ``mis_high``)."""

    def check(self) -> None:
        low, high = self.mis_low, self.mis_high  # type: ignore[attr-defined] - the arm's fields
        if low > 0 and high > 0 and not low < high:
            raise FieldError("mis_low", f"must be < algo.loss.mis_high ({high:g}), got {low:g}: the kept band is empty")


def _dual_clip() -> Any:
    return knob(
        0.0,
        "dual clip c > 1 bounds the loss of negative-advantage tokens at -A * c (0 = off)",
        check=lambda v: None if v == 0 or v > 1 else f"must be 0 (off) or > 1, got {v:g}",
    )


@dataclass(frozen=True)
class PPOClipLossConfig(_ISChecks, LossConfig):
    """PPO's clipped surrogate: the clip range (clip-higher when asymmetric), dual clip, truncated or masked IS."""

    policy: Literal["ppo_clip"] = knob(DEFAULT_LOSS, "algo.loss.policy: PPO's clipped surrogate")
    clip_low: float = _clip_low()
    clip_high: float = _clip_high()
    dual_clip: float = _dual_clip()
    tis_cap: float = _tis_cap()
    is_level: Literal["token", "sequence"] = _is_level()
    mis_low: float = _mis_low()
    mis_high: float = _mis_high()


@dataclass(frozen=True)
class DecoupledPPOLossConfig(_ISChecks, LossConfig):
    """Decoupled PPO (AReaL): the clip range against the proximal policy, dual clip, and the truncation or mask of
    the importance weight proximal / behaviour."""

    policy: Literal["decoupled_ppo"] = knob(
        "decoupled_ppo", "algo.loss.policy: decoupled PPO, clipped against the proximal policy"
    )
    clip_low: float = _clip_low()
    clip_high: float = _clip_high()
    dual_clip: float = _dual_clip()
    tis_cap: float = knob(
        0.0,
        "truncation of the importance weight pi_proximal / pi_engine: min(w, tis_cap) (0 = the weight as is)",
        ge=0,
    )
    is_level: Literal["token", "sequence"] = _is_level()
    mis_low: float = _mis_low()
    mis_high: float = _mis_high()


@dataclass(frozen=True)
class GSPOLossConfig(LossConfig):
    """GSPO: the clip range of the sequence-level ratio (the paper's is small: 3e-4 below, 4e-4 above)."""

    policy: Literal["gspo"] = knob("gspo", "algo.loss.policy: GSPO's sequence-level ratio")
    clip_low: float = _clip_low()
    clip_high: float = _clip_high()


@dataclass(frozen=True)
class CISPOLossConfig(_ISChecks, LossConfig):
    """CISPO: the upper bound of the stop-gradient IS weight, truncated or masked IS against the engine."""

    policy: Literal["cispo"] = knob("cispo", "algo.loss.policy: CISPO's clipped stop-gradient IS weight")
    clip_high: float = _clip_high("the IS weight's bound above 1: min(r, 1 + clip_high)")
    tis_cap: float = _tis_cap()
    is_level: Literal["token", "sequence"] = _is_level()
    mis_low: float = _mis_low()
    mis_high: float = _mis_high()


@dataclass(frozen=True)
class UserLossConfig(LossConfig):
    """A policy loss named by dotted path ``pkg.module.Class`` whose class declares no ``settings`` of its
    own: keyword arguments of its constructor. A class that declares ``settings`` (a ``LossConfig`` subclass
    in its own file, docs/algorithms.md) has those keys here instead."""

    kwargs: dict[str, Any] = knob(
        doc="constructor keyword arguments of a policy loss named by dotted path", factory=dict
    )

    def check(self) -> None:
        if self.policy in _LOSS_ARMS:
            raise FieldError("policy", f"{self.policy} has settings of its own: build it with LossConfig(policy=...)")

    @classmethod
    def key_hint(cls, key: str, data: dict) -> str:
        """Another loss's key, or a key of a user's loss whose class (and so its settings) cannot be found."""
        from rl.algos.policy_losses import PolicyLossError, loss_class

        try:
            loss_class(str(data.get("policy", DEFAULT_LOSS)))
        except PolicyLossError as e:
            return f" (algo.loss.policy: {e}, so its settings are unknown)"
        return super().key_hint(key, data)


_LOSS_ARMS: dict[str, type[LossConfig]] = {
    tag: arm
    for arm in (PPOClipLossConfig, GSPOLossConfig, CISPOLossConfig, DecoupledPPOLossConfig)
    for tag in tags_of(arm)
}


def loss_arm(policy: Any) -> type[LossConfig]:
    """The arm that ``algo.loss.policy`` chooses: a shipped loss's; else the ``settings`` its class declares
    (imported here, a user's loss); ``UserLossConfig`` when it declares none or cannot be resolved (the
    cross-section rules then name ``algo.loss.policy``)."""
    if not isinstance(policy, str):
        return UserLossConfig
    if policy in _LOSS_ARMS:
        return _LOSS_ARMS[policy]
    from rl.algos.policy_losses import PolicyLossError, loss_class

    try:
        return loss_class(policy).settings
    except PolicyLossError:
        return UserLossConfig


def loss_arms() -> list[type[LossConfig]]:
    """Every arm of the ``algo.loss`` union shipped here, then the dotted-path one (the docs' order)."""
    return [*dict.fromkeys(_LOSS_ARMS.values()), UserLossConfig]


@dataclass(frozen=True)
class KLConfig(Section):
    """The KL-to-reference term (a frozen reference model is kept only when coef > 0)."""

    coef: float = knob(
        0.0, "KL-to-reference coefficient, the initial one when adaptive (0 = no reference model is kept)", ge=0
    )
    kind: Literal["k1", "k2", "k3"] = knob("k3", "KL estimator")
    in_reward: bool = knob(
        False, "false: coefficient x aggregated KL in the loss; true: -coefficient x KL per token in the reward"
    )
    target: float = knob(0.0, "> 0: adaptive coefficient steering kl/mean toward this target (0 = fixed coef)", ge=0)
    horizon: int = knob(10000, "adaptive KL: samples over which the coefficient may change by +-20%", ge=1)

    def check(self) -> None:
        if self.in_reward and self.coef == 0:
            raise FieldError("in_reward", "needs algo.kl.coef > 0 (the coefficient of the per-token KL penalty)")
        if self.target > 0 and self.coef == 0:
            raise FieldError("target", "an adaptive KL coefficient needs algo.kl.coef > 0 as its initial value")


@dataclass(frozen=True)
class CriticConfig(Section):
    """The value model of an estimator with a critic."""

    model: Literal["value_head", "separate"] = knob(
        "value_head", "value_head (linear head on the policy's last hidden states) | separate (own model copy)"
    )
    lr: float = knob(0.0, "learning rate of the value head / separate critic (0 = algo.optim.lr)", ge=0)
    vf_coef: float = knob(0.5, "weight of the value loss", ge=0)
    value_clip: float = knob(0.2, "clip of the value update around the old values (0 = unclipped value loss)", ge=0)


@dataclass(frozen=True)
class DiscountConfig(Section):
    """The discount of per-token rewards (reinforce_pp: the return-to-go)."""

    gamma: float = knob(1.0, "discount per policy token", ge=0, le=1)

    @classmethod
    def key_hint(cls, key: str, data: dict) -> str:
        return " (GAE's lambda: a setting of ppo)" if key == "lam" and cls is DiscountConfig else ""


@dataclass(frozen=True)
class ReturnsConfig(DiscountConfig):
    """Discounted returns and GAE's lambda (ppo)."""

    lam: float = knob(0.95, "GAE lambda", ge=0, le=1)


@dataclass(frozen=True)
class UpdateConfig(Section):
    epochs: int = knob(1, "passes over each batch", ge=1)
    minibatches: int = knob(1, "optimizer steps per epoch (shuffled minibatches of the batch)", ge=1)
    zero_variance: Literal["keep", "drop"] = knob(
        "keep", "groups whose rewards are all equal: keep (KL still acts) | drop (DAPO-style filter)"
    )


@dataclass(frozen=True)
class RewardNormConfig(Section):
    """Reward shaping before the estimator: per-domain running statistics (rl/algos/shaping.py)."""

    mode: Literal["none", "domain"] = knob(
        "none",
        "none | domain: each reward becomes (r - mu_d) / (sigma_d + eps) with "
        "its domain's running mean and std, then the estimator runs",
    )
    stat: Literal["welford", "ema"] = knob("welford", "running per-domain statistics: welford (all rewards seen) | ema")
    ema: float = knob(0.1, "EMA weight when stat is ema", gt=0, le=1)
    prior_samples: int = knob(
        0,
        "warm-up: each domain's std starts from prior_std as if it had seen this many rewards, "
        "its own outweighing them as they come (0 = none: its own from the first batch)",
        ge=0,
    )
    prior_std: float = knob(0.5, "the warm-up prior's reward std (used with prior_samples > 0)", gt=0)

    def check(self) -> None:
        if self.prior_std != 0.5 and not self.prior_samples:  # a setting that would be ignored
            raise FieldError("prior_std", "is set but algo.reward_norm.prior_samples is 0")


DEFAULT_ALGO = "grpo"  # algo.name when a recipe leaves it out


@dataclass(frozen=True)
class AlgoConfig(TaggedUnion, tag="name", where="algo", default=DEFAULT_ALGO, user="an estimator named by dotted path"):
    """The advantage estimator and the learner's objective (rl/algos/estimators.py): the keys every
    algorithm has. ``AlgoConfig(name=...)`` builds the arm of that name (below)."""

    name: str = knob(
        DEFAULT_ALGO,
        "estimator: grpo | dr_grpo | rloo (group baselines) | reinforce_pp (batch baseline) | ppo "
        "(GAE critic) | a dotted path pkg.module.Class of your own (see docs/algorithms.md); it decides "
        "which further keys algo has (below)",
        check=lambda v: None if v else "an estimator name is needed",
    )
    optim: OptimConfig = knob(doc="optimizer", factory=OptimConfig)
    loss: LossConfig = knob(doc="policy loss", factory=LossConfig)
    kl: KLConfig = knob(doc="KL to the reference model", factory=KLConfig)
    update: UpdateConfig = knob(doc="epochs and minibatches per batch", factory=UpdateConfig)
    reward_norm: RewardNormConfig = knob(
        doc="per-domain reward normalization before the estimator", factory=RewardNormConfig
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss.agg == "auto":  # the one place `auto` is resolved: the estimator's own aggregation
            object.__setattr__(self, "loss", dataclasses.replace(self.loss, agg=self._default_agg()))

    def _default_agg(self) -> str:
        from rl.algos.estimators import EstimatorError, estimator_class

        try:
            return estimator_class(self.name).default_agg
        except EstimatorError as e:
            raise FieldError("name", str(e)) from None

    @classmethod
    def arm_of(cls, tag: Any) -> type:
        return algo_arm(tag)

    @classmethod
    def all_arms(cls) -> list[type]:
        return algo_arms()


@dataclass(frozen=True)
class GroupAlgoConfig(AlgoConfig):
    """The group baselines, with no settings of their own: grpo (the group z-score), dr_grpo (the group mean;
    its loss sums tokens over a constant, algo.loss.norm_tokens), rloo (leave-one-out; groups of 2 or more)."""

    name: Literal["grpo", "dr_grpo", "rloo"] = knob(DEFAULT_ALGO, "algo.name: one of the group-baseline estimators")


@dataclass(frozen=True)
class ReinforcePPConfig(AlgoConfig):
    """REINFORCE++: the batch baseline; with a per-token KL penalty, the discounted return-to-go."""

    name: Literal["reinforce_pp"] = knob("reinforce_pp", "algo.name: the REINFORCE++ estimator")
    returns: DiscountConfig = knob(doc="discount of the return-to-go", factory=DiscountConfig)


@dataclass(frozen=True)
class PPOConfig(AlgoConfig):
    """PPO: a critic, and GAE on its values."""

    name: Literal["ppo"] = knob("ppo", "algo.name: the PPO estimator")
    critic: CriticConfig = knob(doc="the value model", factory=CriticConfig)
    returns: ReturnsConfig = knob(doc="discount and GAE lambda", factory=ReturnsConfig)


@dataclass(frozen=True)
class UserAlgoConfig(AlgoConfig):
    """An estimator named by dotted path ``pkg.module.Class`` (or registered by a user under a short name):
    its constructor's keyword arguments, and a critic and returns for a class that declares them in its
    ``sections``."""

    kwargs: dict[str, Any] = knob(doc="constructor keyword arguments of the estimator", factory=dict)
    critic: CriticConfig = knob(doc="the value model (a class with needs_critic)", factory=CriticConfig)
    returns: ReturnsConfig = knob(
        doc="discount and GAE lambda (a class that lists returns in sections)", factory=ReturnsConfig
    )

    def check(self) -> None:
        if self.name in _ARMS:
            raise FieldError("name", f"{self.name} has settings of its own: build it with AlgoConfig(name=...)")


_ARMS: dict[str, type[AlgoConfig]] = {
    tag: arm for arm in (GroupAlgoConfig, ReinforcePPConfig, PPOConfig) for tag in tags_of(arm)
}


def algo_arm(name: Any) -> type[AlgoConfig]:
    """The arm of the union that ``algo.name`` chooses: a built-in estimator's, else the dotted-path one."""
    return _ARMS.get(name, UserAlgoConfig) if isinstance(name, str) else UserAlgoConfig


def algo_arms() -> list[type[AlgoConfig]]:
    """Every arm of the union, the registered estimators' first (the docs list them in this order)."""
    return [*dict.fromkeys(_ARMS.values()), UserAlgoConfig]
