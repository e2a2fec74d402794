"""The learner's statistics as typed records: ``Sums`` (additive over micro-batches and ranks), ``UpdateLog``
(the optimizer steps of one learner step) and ``StepMetrics`` (what a step reports, by metric name).

``StepMetrics.of`` turns the whole batch's sums into means (tokens) and per-update averages (loss terms) of the
terms the run has (``Present``);
``to_dict`` names them as the driver logs them (``loss/policy``, ``clip/fraction``, ``async/mismatch_kl/<domain>``,
...), leaving out the
terms the run does not have (no KL without a reference, no value metrics without a critic). No tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from rl.algos.objective import ObjectiveStats


@dataclass
class Sums:
    """Additive per-step statistics (floats), summed over micro-batches and then over the ranks.

    The loss terms are each minibatch's aggregated term (summed over optimizer steps); the
    others are sums over tokens, turned into means by ``StepMetrics.of``.
    """

    policy_loss: float = 0.0
    kl_loss: float = 0.0
    value_loss: float = 0.0
    entropy_loss: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    tokens: float = 0.0
    tokens_first_epoch: float = 0.0
    logprob_diff: float = 0.0
    logprob_diff_tokens: float = 0.0
    value: float = 0.0
    value_error: float = 0.0
    value_clipped: float = 0.0
    returns: float = 0.0
    aux_loss: float = 0.0
    # the policy loss's stats (its ``stat_names``), each summed as value x tokens
    loss_stats: dict[str, float] = field(default_factory=dict)
    # per domain: k3(engine -> learner) summed over the policy tokens before the update, and those tokens
    mismatch_kl: dict[str, float] = field(default_factory=dict)
    mismatch_tokens: dict[str, float] = field(default_factory=dict)

    _DICTS = ("loss_stats", "mismatch_kl", "mismatch_tokens")

    def add(self, st: ObjectiveStats, ntok: float, entropy_sum: float, first_epoch: bool) -> None:
        """One micro-batch's objective stats (``ntok`` policy tokens; token means weighted by it)."""
        self.policy_loss += st.policy_loss
        self.kl_loss += st.kl_loss
        self.kl += st.kl_sum
        self.entropy_loss += st.entropy_loss
        self.value_loss += st.value_loss
        self.value += st.value_mean * ntok
        self.value_error += st.value_error * ntok
        self.value_clipped += st.value_clip_fraction * ntok
        self.returns += st.returns_sum
        self.aux_loss += st.aux_loss
        for k, v in st.policy.items():
            self.loss_stats[k] = self.loss_stats.get(k, 0.0) + v * ntok
        self.entropy += entropy_sum
        self.tokens += ntok
        if first_epoch:
            self.tokens_first_epoch += ntok

    def add_mismatch(self, domain: str, kl_sum: float, tokens: float) -> None:
        """One sample's k3 sum over its ``tokens`` policy tokens (``async/mismatch_kl``)."""
        self.mismatch_kl[domain] = self.mismatch_kl.get(domain, 0.0) + kl_sum
        self.mismatch_tokens[domain] = self.mismatch_tokens.get(domain, 0.0) + tokens

    def values(self, stat_names: tuple[str, ...], domains: tuple[str, ...] = ()) -> list[float]:
        """Every sum as one flat list (for the all-reduce over ranks): the scalars, the loss's stats in the order of
        ``stat_names``, then the per-domain mismatch sums in the order of ``domains`` (the same on every rank)."""
        scalars = [getattr(self, f.name) for f in fields(self) if f.name not in self._DICTS]
        per_domain = [self.mismatch_kl.get(d, 0.0) for d in domains] + [
            self.mismatch_tokens.get(d, 0.0) for d in domains
        ]
        return scalars + [self.loss_stats.get(k, 0.0) for k in stat_names] + per_domain

    @classmethod
    def of(cls, values: list[float], stat_names: tuple[str, ...], domains: tuple[str, ...] = ()) -> "Sums":
        k, d = len(stat_names), len(domains)
        n = len(values) - k - 2 * d
        kl, tok = values[n + k : n + k + d], values[n + k + d :]
        return cls(
            *values[:n],
            loss_stats=dict(zip(stat_names, values[n : n + k])),
            mismatch_kl={x: v for x, v, t in zip(domains, kl, tok) if t},
            mismatch_tokens={x: t for x, t in zip(domains, tok) if t},
        )


@dataclass
class UpdateLog:
    """The optimizer steps of one learner step: pre-clip gradient norms (policy, separate critic), steps skipped
    for a non-finite gradient, the learning rate of the last one."""

    lr: float
    norms: list[float] = field(default_factory=list)
    critic_norms: list[float] = field(default_factory=list)
    skipped: int = 0


@dataclass(frozen=True)
class Present:
    """The terms a run has, so that its metrics report them and only them: an entropy bonus, a KL to a reference,
    a value loss (a value head or a separate critic), a separate critic's optimizer, an auxiliary loss."""

    entropy: bool = False
    kl: bool = False
    value: bool = False
    critic: bool = False
    aux: bool = False


def _mismatch(tot: Sums) -> dict[str, float]:
    """``async/mismatch_kl`` (the token mean over every domain) and ``async/mismatch_kl/<domain>``, from the sums of
    the domains that had policy tokens; {} when none had."""
    n = sum(tot.mismatch_tokens.values())
    if not n:
        return {}
    out = {"async/mismatch_kl": sum(tot.mismatch_kl.values()) / n}
    for d in sorted(tot.mismatch_tokens):
        out[f"async/mismatch_kl/{d}"] = tot.mismatch_kl.get(d, 0.0) / tot.mismatch_tokens[d]
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


@dataclass
class StepMetrics:
    """One learner step's metrics (see ``Learner.step``); None: not reported by this run."""

    loss_policy: float
    entropy_mean: float
    grad_norm: float
    lr: float
    tokens: float
    updates: float
    skipped_update: float
    logprob_diff: float
    loss_stats: dict[str, float] = field(default_factory=dict)  # the policy loss's own (clip/fraction, is/*)
    mismatch_kl: dict[str, float] = field(default_factory=dict)  # async/mismatch_kl[/<domain>]
    loss_entropy: float | None = None
    loss_kl: float | None = None
    kl_mean: float | None = None
    kl_coef: float | None = None
    loss_value: float | None = None
    value_mean: float | None = None
    value_error: float | None = None
    value_clip_fraction: float | None = None
    returns_mean: float | None = None
    critic_grad_norm: float | None = None
    loss_aux: float | None = None
    memory_trimmed: float | None = None
    memory_rss_gb: float | None = None
    compute_s: float | None = None

    NAMES = {
        "loss_policy": "loss/policy",
        "entropy_mean": "entropy/mean",
        "grad_norm": "grad/norm",
        "lr": "lr",
        "tokens": "learner/tokens",
        "updates": "learner/updates",
        "skipped_update": "learner/skipped_update",
        "logprob_diff": "rollout/logprob_diff",
        "loss_entropy": "loss/entropy",
        "loss_kl": "loss/kl",
        "kl_mean": "kl/mean",
        "kl_coef": "kl/coef",
        "loss_value": "loss/value",
        "value_mean": "value/mean",
        "value_error": "value/error",
        "value_clip_fraction": "value/clip_fraction",
        "returns_mean": "returns/mean",
        "critic_grad_norm": "critic/grad_norm",
        "loss_aux": "loss/aux",
        "memory_trimmed": "memory/trimmed",
        "memory_rss_gb": "memory/learner_rss_gb",
        "compute_s": "timing/learner_compute_s",
    }

    @classmethod
    def of(
        cls,
        tot: Sums,
        log: UpdateLog,
        n_up: int,
        updates: int,
        computed: bool,
        terms: Present,
    ) -> "StepMetrics":
        """From the whole batch's sums; ``n_up`` optimizer steps planned; ``terms``: which terms the run has."""
        n = max(tot.tokens, 1.0)
        m = cls(
            loss_policy=tot.policy_loss / n_up,
            entropy_mean=tot.entropy / n,
            grad_norm=_mean(log.norms),
            lr=log.lr,
            tokens=tot.tokens_first_epoch,
            updates=float(updates),
            skipped_update=log.skipped / n_up if computed else 0.0,
            logprob_diff=tot.logprob_diff / max(tot.logprob_diff_tokens, 1.0),
            loss_stats={k: v / n for k, v in tot.loss_stats.items()},
            mismatch_kl=_mismatch(tot),
        )
        if terms.entropy:
            m.loss_entropy = tot.entropy_loss / n_up
        if terms.kl:
            m.loss_kl, m.kl_mean = tot.kl_loss / n_up, tot.kl / n
        if terms.value:
            m.loss_value, m.value_mean, m.value_error = tot.value_loss / n_up, tot.value / n, tot.value_error / n
            m.value_clip_fraction, m.returns_mean = tot.value_clipped / n, tot.returns / n
        if terms.critic:
            m.critic_grad_norm = _mean(log.critic_norms)
        if terms.aux:
            m.loss_aux = tot.aux_loss / n_up
        return m

    def to_dict(self) -> dict[str, float]:
        """By metric name, the reported ones only (the policy loss's stats after ``learner/*``)."""
        out: dict[str, float] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("loss_stats", "mismatch_kl"):
                out.update(v)
            elif v is not None:
                out[self.NAMES[f.name]] = float(v)
        return out
