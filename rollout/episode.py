"""Multi-turn episodes, token in, token out: tasks + an engine + envs -> trajectories.

All episodes of a call advance turn by turn together: one batched ``engine.generate`` per
turn for every episode still running, then each env's ``step``. The trajectory keeps the
exact token ids the engine sampled; text is only decoded to hand the env its action.
Environment observations are rendered through the model's chat template and appended as
tokens with ``loss_mask`` 0, using the template's own rendering of the conversation (the
template must be prefix-stable: rendering a longer conversation extends a shorter one).

Episode ends are honest: the env's ``terminated`` / ``truncated`` flags are kept; an
episode whose last turn was cut by ``max_new_tokens``, or that the rollout ends itself
(``max_turns``, ``max_model_len``, a template that cannot continue), is ``truncated``. A
turn cut by ``max_new_tokens`` does not end a multi-turn episode by itself: the env sees
the cut action and decides. When the rollout ends an episode early it calls the env's
optional ``finalize()`` so that self-scoring envs (terminal checks) still score it.
This module does not score trajectories (``rewards``) or train (``rl``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from envs.types import Generation, Message, Sampling, Task, Trajectory


class Engine(Protocol):
    """``stops[i]``: strings that end prompt i's completion once its text holds one (the tokens up
    to the one completing it are returned, ``finish_reason`` "stop"); ``[]``: none."""

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        stops: list[list[str]] | None = None,
    ) -> list[Generation]: ...


def render(tokenizer: Any, messages: list[Message], add_generation_prompt: bool) -> str:
    """The chat template's text for ``messages``."""
    msgs = [{"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})} for m in messages]
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=False)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass
class _Episode:
    task: Task
    group_id: int
    seed: int
    env: Any
    prompt_ids: list[int]
    messages: list[Message]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)  # the domain's stop strings (rollout.envs[].stop)
    turns: int = 0
    terminated: bool = False
    truncated: bool = False
    finish_reason: str = ""
    env_reward: float | None = None
    sandbox_events: list[str] | None = None
    done: bool = False
    # Text the engine's tokens of the current conversation correspond to (for env-token deltas).
    text: str = ""


def run_episodes(
    engine: Engine,
    tokenizer: Any,
    make_env: Callable[[str], Any],
    tasks: list[Task],
    group_ids: list[int],
    seeds: list[int],
    sampling: Sampling,
    stops: dict[str, list[str]] | None = None,
) -> list[Trajectory]:
    """Run one episode per task (in order) and return their trajectories.

    ``make_env(domain)`` returns a fresh env for a task of that domain; it is closed at the
    end of its episode, also on errors. ``stops[domain]``: strings that end a policy turn of
    that domain (e.g. ``</tool_call>``); a turn ended by one is not cut, and its env sees the
    action with the stop string in it.
    """
    eps: list[_Episode] = []
    try:
        _start_episodes(eps, tokenizer, make_env, tasks, group_ids, seeds, sampling)
        for e in eps:
            e.stop = (stops or {}).get(e.task.domain, [])
        while True:
            active = [e for e in eps if not e.done]
            if not active:
                break
            gens = engine.generate(
                [e.prompt_ids + e.response_ids for e in active],
                sampling,
                seeds=[e.seed * 7919 + e.turns for e in active],
                stops=[e.stop for e in active],
            )
            for e, gen in zip(active, gens):
                _advance(e, gen, tokenizer, sampling)
    finally:
        for e in eps:
            e.env.close()
    return [_trajectory(e) for e in eps]


def _start_episodes(
    eps: list[_Episode],
    tokenizer: Any,
    make_env: Callable[[str], Any],
    tasks: list[Task],
    group_ids: list[int],
    seeds: list[int],
    sampling: Sampling,
) -> None:
    """Append an episode per task to ``eps`` (its env made and reset, its prompt rendered and tokenized). Each
    env is in ``eps`` as soon as it exists, so that the caller closes it if a later one fails."""
    for task, g, s in zip(tasks, group_ids, seeds, strict=True):
        env = make_env(task.domain)
        eps.append(_Episode(task=task, group_id=g, seed=s, env=env, prompt_ids=[], messages=[]))
        msgs = list(env.reset(task))
        text = render(tokenizer, msgs, add_generation_prompt=True) + task.prefill
        eps[-1].messages, eps[-1].text, eps[-1].prompt_ids = msgs, text, encode(tokenizer, text)
    for e in eps:
        if len(e.prompt_ids) >= sampling.max_model_len:
            # No room to generate: an empty, truncated episode (no policy tokens, so never trained on).
            e.truncated, e.done, e.finish_reason = True, True, "prompt_too_long"


def _trajectory(e: _Episode) -> Trajectory:
    """The finished episode as a trajectory."""
    return Trajectory(
        task=e.task,
        group_id=e.group_id,
        prompt_ids=e.prompt_ids,
        response_ids=e.response_ids,
        loss_mask=e.loss_mask,
        logprobs=e.logprobs,
        messages=e.messages,
        terminated=e.terminated,
        truncated=e.truncated,
        finish_reason=e.finish_reason,
        num_turns=e.turns,
        env_reward=e.env_reward,
        sandbox_events=e.sandbox_events,
    )


def _advance(e: _Episode, gen: Generation, tokenizer: Any, sampling: Sampling) -> None:
    """Append one policy turn to episode ``e``, step its env, and append the observation tokens."""
    e.response_ids += gen.token_ids
    e.loss_mask += [1] * len(gen.token_ids)
    e.logprobs += gen.logprobs
    # Special tokens stay in the text (skipping them would desync text and tokens); only the
    # closing EOS of a finished turn is not part of the action.
    ids = gen.token_ids
    ended = gen.finish_reason == "stop" and bool(ids) and ids[-1] == tokenizer.eos_token_id
    generated = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
    action = (e.task.prefill if e.turns == 0 else "") + generated
    e.turns += 1
    obs, terminated, truncated, info = e.env.step(action)
    if isinstance(info, dict) and isinstance(info.get("reward"), (int, float)):
        e.env_reward = float(info["reward"])
    _note_sandbox_events(e, info)
    e.messages = e.messages + [Message("assistant", action)] + list(obs)
    e.finish_reason = gen.finish_reason
    cut = gen.finish_reason == "length"
    if terminated or truncated:
        # A final turn cut by max_new_tokens makes a truncated episode, whatever the env concluded.
        e.terminated, e.truncated, e.done = bool(terminated) and not cut, bool(truncated) or cut, True
        return
    if e.turns >= sampling.max_turns:
        return _end_early(e, "max_turns")
    # The conversation's text now is the old text + exactly what the engine produced. A turn cut
    # by max_new_tokens has no EOS: the template's closing tokens then come as env tokens.
    e.text += tokenizer.decode(ids, skip_special_tokens=False)
    full = render(tokenizer, e.messages, add_generation_prompt=True)
    if not full.startswith(e.text):
        # The template re-renders this turn differently from what the engine produced (e.g. the
        # policy emitted special tokens mid-turn): continuing would desynchronise tokens and text.
        return _end_early(e, "template_mismatch")
    delta = encode(tokenizer, full[len(e.text) :])
    e.text = full
    if len(e.prompt_ids) + len(e.response_ids) + len(delta) + 1 >= sampling.max_model_len:
        return _end_early(e, "max_model_len")
    e.response_ids += delta
    e.loss_mask += [0] * len(delta)
    e.logprobs += [0.0] * len(delta)


def _end_early(e: _Episode, reason: str) -> None:
    """The rollout ends an episode the env has not ended: truncated, and the env may still score it."""
    e.truncated, e.done, e.finish_reason = True, True, reason
    finalize = getattr(e.env, "finalize", None)
    if callable(finalize):
        info = finalize()
        if isinstance(info, dict) and isinstance(info.get("reward"), (int, float)):
            e.env_reward = float(info["reward"])
        _note_sandbox_events(e, info)


def _note_sandbox_events(e: _Episode, info: Any) -> None:
    """Collect ``info["sandbox_events"]`` (a list of event names) for the step metrics."""
    events = info.get("sandbox_events") if isinstance(info, dict) else None
    if isinstance(events, list):
        e.sandbox_events = (e.sandbox_events or []) + [str(x) for x in events]
