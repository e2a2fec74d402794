"""Multi-turn episodes, token in, token out: tasks + an engine + envs -> trajectories.

With a streaming engine (``submit``/``poll``/``abort``: ``rollout.engine.VLLMEngine``) each
episode moves on by itself: its next turn joins the engine's running batch as soon as its env
has answered, while other episodes are still generating or in their envs. So a multi-turn batch
takes about its tokens' decode time, not the sum over turns of each turn's longest completion
plus its slowest env call (``bench/episode_stream.py`` compares the two; bench/RESULTS.md). With an
engine that only has a batched ``generate`` (``rollout.hf_engine.HFEngine``, test engines) all
episodes advance turn by turn together: one ``generate`` per turn for every episode still
running, then each env's ``step``. Either way a request's sampling seed is its episode's seed and
turn, so what an episode samples does not depend on what it was batched with. Env calls
(``reset``, ``step``, ``finalize``: sandboxed commands, unit tests, tools) run on up to
``env_workers`` threads at once, each env instance on one thread at a time. Everything else
(tokenizing, templates) stays on the calling thread. The trajectory keeps the
exact token ids the engine sampled; text is only decoded to hand the env its action.
Environment observations are rendered through the model's chat template and appended as
tokens with ``loss_mask`` 0, using the template's own rendering of the conversation (the
template must be prefix-stable: rendering a longer conversation extends a shorter one). A tool-call
task's function schemas are placed once per episode (the chat template's ``tools=``, or the system
message: :mod:`rollout.tools_prompt`) and rendered the same way at every turn; the trajectory keeps
the rendered prompt (``Trajectory.prompt``) for the rollouts log.

Partial rollouts (``rollout.partial``): an engine that can pause returns a request stopped by a weight update
as an "interrupted" completion holding its tokens so far. The episode keeps them (``_Episode.kept``) and sends
the turn again as prompt + kept tokens, with the remaining budget (``max_new_tokens`` minus the kept tokens),
the same stop strings, seed and turn; the engine runs it once the new weights are loaded. The finished turn is
the kept tokens then the continuation, each token with the policy version that sampled it
(``Trajectory.token_versions``). Env calls in flight are not interrupted.

Episode ends are honest: the env's ``terminated`` / ``truncated`` flags are kept; an
episode whose last turn was cut by ``max_new_tokens``, or that the rollout ends itself
(``max_turns``, ``max_model_len``, a template that cannot continue), is ``truncated``. A
turn cut by ``max_new_tokens`` does not end a multi-turn episode by itself: the env sees
the cut action and decides. When the rollout ends an episode early it calls the env's
optional ``finalize()`` so that self-scoring envs (terminal checks) still score it.

Env calls are contained: an exception out of an env's ``reset``, ``step``, ``finalize`` or
``close``, or out of rendering what it returned (a ``RecursionError`` from a host-side walk of a
tree the policy built, a ``MemoryError``, a harness bug), ends that episode only, as a harness
failure: its trajectory carries ``reward_error`` ("harness: <domain> env <call> raised ...") and
a ``harness_error`` sandbox event, so the reward service leaves it unscored and the trainer leaves
it out of the loss and the group baseline while the batch's other samples train. What the policy
did wrong (its program crashed, timed out, hit a limit) is the env's to score and never raises.
Only ``SandboxUnavailable`` (the host cannot sandbox at all, a setup error) and interrupts
(``KeyboardInterrupt``, ``SystemExit``) still end the rollout call, as engine errors do.
This module does not score trajectories (``rewards``) or train (``rl``).
"""

from __future__ import annotations

import logging
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, TypeVar, runtime_checkable

import numpy as np

from envs.sandbox.base import SandboxUnavailable
from envs.types import Generation, Message, Sampling, Task, Trajectory
from rollout.partial import INTERRUPTED, joined
from rollout.tools_prompt import ToolsPlacement, check_mode, place_tools

logger = logging.getLogger("rollout")
# Errors an env call still raises out of the rollout: the host cannot sandbox at all (a setup error
# that would fail every sample alike, so it must stop the run with its own message, not be averaged away).
_NOT_CONTAINED = (SandboxUnavailable,)
_REASON_CHARS = 500


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


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """An engine whose requests join its running batch: ``submit`` one, ``poll`` (one engine step)
    for the ones that finished, as ``(key, completion)``; ``abort`` drops every unfinished one. An engine that
    can pause also takes ``offset`` (kept tokens at the end of the prompt) in ``submit`` and may return
    "interrupted" completions (``rollout.partial``); an engine that cannot never returns one."""

    def submit(self, key: int, prompt: list[int], sampling: Sampling, seed: int | None, stop: list[str]) -> None: ...

    def poll(self) -> list[tuple[int, Generation]]: ...

    def abort(self) -> None: ...


def render(
    tokenizer: Any, messages: list[Message], add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None
) -> str:
    """The chat template's text for ``messages``; ``tools`` (function schemas in the chat-template form
    ``{"type": "function", "function": {...}}``) are handed to the template as ``tools=`` when given."""
    msgs = [{"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})} for m in messages]
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=False, **extra)


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
    cut_turns: int = 0  # policy turns that ended at max_new_tokens
    terminated: bool = False
    truncated: bool = False
    finish_reason: str = ""
    env_reward: float | None = None
    sandbox_events: list[str] | None = None
    done: bool = False
    action: str = ""  # the current turn's action, for its env's step
    prefill: str = ""  # the current turn's pre-start (the task's on turn 1, then the env's info["prefill"])
    # Text the engine's tokens of the current conversation correspond to (for env-token deltas).
    text: str = ""
    harness_error: str | None = None  # why an env call of this episode failed (a harness failure)
    tools: ToolsPlacement = field(default_factory=ToolsPlacement)  # where the task's tool schemas go
    prompt: str = ""  # the rendered prompt (chat template, system and tools included; without the prefill)
    # MoE: per token run so far, its experts (Trajectory.routing); None once a turn came without routing
    routing: np.ndarray | None = None
    # Per response token, the policy version that sampled it (-1: env token); None once a turn came without
    token_versions: list[int] | None = field(default_factory=list)
    kept: Generation | None = None  # the current turn's tokens so far, from interrupted requests


T = TypeVar("T")


class _EnvCalls:
    """Runs one env call per episode, on up to ``workers`` threads (inline with 1), results in order.

    An env call that raises re-raises here once every call of the batch has ended, so that no env
    is closed while another thread is still inside it."""

    def __init__(self, workers: int, episodes: int) -> None:
        n = min(workers, episodes)
        self.pool = ThreadPoolExecutor(n, thread_name_prefix="env") if n > 1 else None

    def each(self, fn: Callable[[_Episode], T], eps: list[_Episode]) -> list[T]:
        if self.pool is None or len(eps) < 2:
            return [fn(e) for e in eps]
        futures = [self.pool.submit(fn, e) for e in eps]
        errors = [f.exception() for f in futures]  # waits for all of them
        first = next((x for x in errors if x is not None), None)
        if first is not None:
            raise first
        return [f.result() for f in futures]

    def submit(self, fn: Callable[..., T], *args: Any) -> "Future[T]":
        """One env call, on a thread (inline with one worker: the future is then done already)."""
        if self.pool is not None:
            return self.pool.submit(fn, *args)
        f: Future[T] = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever takes the result
            f.set_exception(exc)
        return f

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def run_episodes(
    engine: Engine,
    tokenizer: Any,
    make_env: Callable[[str], Any],
    tasks: list[Task],
    group_ids: list[int],
    seeds: list[int],
    sampling: Sampling,
    stops: dict[str, list[str]] | None = None,
    env_workers: int = 1,
    tools_in_prompt: str = "auto",
) -> list[Trajectory]:
    """Run one episode per task (in order) and return their trajectories.

    ``make_env(domain)`` returns a fresh env for a task of that domain; it is closed at the
    end of its episode, also on errors. ``stops[domain]``: strings that end a policy turn of
    that domain (e.g. ``</tool_call>``); a turn ended by one is not cut, and its env sees the
    action with the stop string in it. ``env_workers``: env calls of different episodes run
    on up to this many threads at once (1: one at a time, on this thread). ``tools_in_prompt``: how a
    tool-call task's schemas reach the prompt (``auto``, ``template``, ``system``:
    :mod:`rollout.tools_prompt`).
    """
    check_mode(tokenizer, tools_in_prompt)
    eps: list[_Episode] = []
    calls = _EnvCalls(env_workers, len(tasks))
    try:
        _start_episodes(eps, tokenizer, make_env, tasks, group_ids, seeds, sampling, calls, tools_in_prompt)
        for e in eps:
            e.stop = (stops or {}).get(e.task.domain, [])
        if isinstance(engine, StreamingEngine):
            _run_streaming(engine, eps, tokenizer, sampling, calls)
        else:
            _run_in_turns(engine, eps, tokenizer, sampling, calls)
    finally:
        calls.close()
        for e in eps:
            _contained(e, "close", e.env.close)
    return [_trajectory(e) for e in eps]


def _contained(e: _Episode, call: str, fn: Callable[..., T], *args: Any) -> T | None:
    """``fn(*args)``, one env call (or handling of its answer) of episode ``e``; an exception ends
    ``e`` as a harness failure (``_fail``) and gives None. Interrupts and ``_NOT_CONTAINED`` pass."""
    try:
        return fn(*args)
    except _NOT_CONTAINED:
        raise
    except Exception as exc:  # noqa: BLE001 - one sample's harness failure must not cost the batch
        _fail(e, call, exc)
        return None


def _fail(e: _Episode, call: str, exc: BaseException) -> None:
    """End episode ``e`` as a harness failure of env call ``call``: the reason becomes its
    ``reward_error`` (the first failure's), and a ``harness_error`` sandbox event is counted."""
    try:
        detail = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose str() fails still names its type
        detail = "<no message>"
    reason = f"harness: {e.task.domain} env {call} raised {type(exc).__name__}: {detail[:_REASON_CHARS]}"
    logger.warning("task %r: %s", e.task.id, reason, exc_info=(type(exc), exc, exc.__traceback__))
    if e.harness_error is None:
        e.harness_error = reason
        e.sandbox_events = (e.sandbox_events or []) + ["harness_error"]
    if not e.done:
        e.terminated, e.truncated, e.done, e.finish_reason = False, False, True, "harness_error"


def _run_in_turns(engine: Engine, eps: list[_Episode], tokenizer: Any, sampling: Sampling, calls: _EnvCalls) -> None:
    """Every running episode's turn in one ``generate``, then their env steps; until all are done."""
    while True:
        active = [e for e in eps if not e.done]
        if not active:
            return
        gens = _generate_turn(engine, active, sampling)
        for e, gen in zip(active, gens):
            _act(e, gen, tokenizer)
        results = calls.each(lambda e: _contained(e, "step", e.env.step, e.action), active)
        ended = [
            e
            for e, gen, res in zip(active, gens, results)
            if res is not None and _contained(e, "step result", _observe, e, gen, res, tokenizer, sampling)
        ]
        calls.each(lambda e: _contained(e, "finalize", _finalize, e), ended)


def _generate_turn(engine: Engine, eps: list[_Episode], sampling: Sampling) -> list[Generation]:
    """Each episode's next turn through ``generate``; a turn interrupted by a weight update (kept tokens) is
    generated again from where it stopped, with the remaining budget, until every turn has finished."""
    out: list[Generation | None] = [None] * len(eps)
    todo = list(range(len(eps)))
    while todo:
        by_budget: dict[int, list[int]] = {}
        for i in todo:
            by_budget.setdefault(_room(eps[i], sampling), []).append(i)
        todo = []
        for budget, idxs in by_budget.items():
            part = [eps[i] for i in idxs]
            offsets = [_kept(e) for e in part]
            gens = engine.generate(
                [e.prompt_ids + e.response_ids + _kept_ids(e) for e in part],
                replace(sampling, max_new_tokens=budget),
                seeds=[_seed(e) for e in part],
                stops=[e.stop for e in part],
                **({"offsets": offsets} if any(offsets) else {}),
            )
            for i, e, gen in zip(idxs, part, gens):
                whole = _resumable(e, gen, sampling)
                if whole is None:
                    todo.append(i)
                else:
                    out[i] = whole
    return out  # type: ignore[return-value]


def _kept(e: _Episode) -> int:
    return len(e.kept.token_ids) if e.kept is not None else 0


def _kept_ids(e: _Episode) -> list[int]:
    return list(e.kept.token_ids) if e.kept is not None else []


def _room(e: _Episode, sampling: Sampling) -> int:
    """The current turn's remaining token budget: ``max_new_tokens`` minus its kept tokens."""
    return sampling.max_new_tokens - _kept(e)


def _resumable(e: _Episode, gen: Generation, sampling: Sampling) -> Generation | None:
    """The whole turn once ``gen`` has finished it: the kept tokens of the turn's interrupted requests, then
    ``gen``. None when ``gen`` was interrupted with budget left: its tokens are kept, the turn is to be resumed
    (``_room``, ``_kept_ids``). An interruption that left no budget ends the turn as "length"."""
    if gen.finish_reason == INTERRUPTED:
        e.kept = joined(e.kept, gen)
        if _room(e, sampling) > 0:
            return None
        gen = Generation([], [], "length", versions=[])
    whole, e.kept = joined(e.kept, gen), None
    return whole


def _run_streaming(
    engine: StreamingEngine, eps: list[_Episode], tokenizer: Any, sampling: Sampling, calls: _EnvCalls
) -> None:
    """Each episode's turns through ``submit``/``poll``: a turn goes to its env as soon as it is sampled,
    the next turn to the engine as soon as the env has answered. On an error the engine's requests are
    dropped and every env call in flight is waited for before it is raised (the caller closes the envs).
    Env calls are contained (``_contained``): a failed one ends its episode only."""
    in_engine = 0
    in_env: dict[Future[Any], tuple[int, Generation | None]] = {}  # None: a finalize call

    def turn(i: int) -> None:
        nonlocal in_engine
        e = eps[i]
        prompt, room, kept = e.prompt_ids + e.response_ids + _kept_ids(e), _room(e, sampling), _kept(e)
        if kept:  # a turn interrupted by a weight update, resumed: waits in submit until the new weights are in
            engine.submit(i, prompt, replace(sampling, max_new_tokens=room), _seed(e), e.stop, offset=kept)
        else:
            engine.submit(i, prompt, sampling, _seed(e), e.stop)
        in_engine += 1

    try:
        for i, e in enumerate(eps):
            if not e.done:
                turn(i)
        while in_engine or in_env:
            if in_engine:
                for i, polled in engine.poll():
                    in_engine -= 1
                    gen = _resumable(eps[i], polled, sampling)
                    if gen is None:
                        turn(i)
                        continue
                    _act(eps[i], gen, tokenizer)
                    in_env[calls.submit(_contained, eps[i], "step", eps[i].env.step, eps[i].action)] = (i, gen)
                ready = [f for f in in_env if f.done()]
            else:
                ready = list(wait(in_env, return_when=FIRST_COMPLETED).done)
            for f in sorted(ready, key=lambda f: in_env[f][0]):
                i, gen = in_env.pop(f)
                result = f.result()  # contained: only an interrupt or _NOT_CONTAINED raises here
                if gen is None or result is None:
                    continue
                if _contained(eps[i], "step result", _observe, eps[i], gen, result, tokenizer, sampling):
                    in_env[calls.submit(_contained, eps[i], "finalize", _finalize, eps[i])] = (i, None)
                elif not eps[i].done:
                    turn(i)
    except BaseException:
        engine.abort()
        wait(in_env)  # no env is closed while a thread is still inside it
        raise


def _seed(e: _Episode) -> int:
    """The sampling seed of episode ``e``'s next turn."""
    return e.seed * 7919 + e.turns


def _start_episodes(
    eps: list[_Episode],
    tokenizer: Any,
    make_env: Callable[[str], Any],
    tasks: list[Task],
    group_ids: list[int],
    seeds: list[int],
    sampling: Sampling,
    calls: _EnvCalls,
    tools_in_prompt: str = "auto",
) -> None:
    """Append an episode per task to ``eps`` (its env made and reset, its prompt rendered and tokenized). Each
    env is in ``eps`` as soon as it exists, so that the caller closes it if a later one fails. Making an env
    is not contained (an unknown domain is a configuration error); a failed ``reset`` or prompt is the
    episode's harness failure, with the task's own messages as its conversation."""
    for task, g, s in zip(tasks, group_ids, seeds, strict=True):
        env = make_env(task.domain)
        eps.append(_Episode(task=task, group_id=g, seed=s, env=env, prompt_ids=[], messages=list(task.messages)))
    resets = calls.each(lambda e: _contained(e, "reset", _reset, e), eps)
    for e, msgs in zip(eps, resets):
        if msgs is not None:
            _contained(e, "reset result", _prompt, e, msgs, tokenizer, tools_in_prompt)
    for e in eps:
        if not e.done and len(e.prompt_ids) >= sampling.max_model_len:
            # No room to generate: an empty, truncated episode (no policy tokens, so never trained on).
            e.truncated, e.done, e.finish_reason = True, True, "prompt_too_long"


def _reset(e: _Episode) -> list[Message]:
    """Reset episode ``e``'s env on its task; an env with ``seed_episode`` is first told the episode's seed (what
    it draws per episode, e.g. a simulated tool latency, then repeats across runs of the same seed)."""
    seed_episode = getattr(e.env, "seed_episode", None)
    if callable(seed_episode):
        seed_episode(e.seed)
    return list(e.env.reset(e.task))


def _prompt(e: _Episode, msgs: list[Message], tokenizer: Any, tools_in_prompt: str) -> None:
    """Set episode ``e``'s conversation to the env's first ``msgs``, place its task's tool schemas
    (:func:`rollout.tools_prompt.place_tools`) and render and tokenize its prompt."""
    e.tools = place_tools(e.task, msgs, tokenizer, tools_in_prompt)
    e.prompt = _render(e, msgs, tokenizer)
    text = e.prompt + e.task.prefill
    e.messages, e.text, e.prompt_ids, e.prefill = msgs, text, encode(tokenizer, text), e.task.prefill


def _render(e: _Episode, msgs: list[Message], tokenizer: Any) -> str:
    """The chat template's text for episode ``e``'s conversation ``msgs`` (with its generation prompt),
    its tool schemas placed as at its start, so that every turn's rendering extends the last one."""
    return render(tokenizer, e.tools.messages(msgs), add_generation_prompt=True, tools=e.tools.template_tools())


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
        cut_turns=e.cut_turns,
        env_reward=e.env_reward,
        sandbox_events=e.sandbox_events,
        reward_error=e.harness_error,
        prompt=e.prompt,
        routing=e.routing,
        token_versions=e.token_versions,
    )


def _act(e: _Episode, gen: Generation, tokenizer: Any) -> None:
    """Append one policy turn to episode ``e`` and set the action its env is stepped with."""
    _route(e, gen)
    e.response_ids += gen.token_ids
    e.loss_mask += [1] * len(gen.token_ids)
    e.logprobs += gen.logprobs
    if e.token_versions is not None and gen.versions is not None and len(gen.versions) == len(gen.token_ids):
        e.token_versions += gen.versions
    else:
        e.token_versions = None
    # Special tokens stay in the text (skipping them would desync text and tokens); only the
    # closing EOS of a finished turn is not part of the action.
    ids = gen.token_ids
    ended = gen.finish_reason == "stop" and bool(ids) and ids[-1] == tokenizer.eos_token_id
    generated = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
    e.action = e.prefill + generated
    e.turns += 1
    e.cut_turns += gen.finish_reason == "length"


def _route(e: _Episode, gen: Generation) -> None:
    """Extend the episode's routing with the rows of the tokens ``gen`` ran first: its prompt (the episode so far)
    repeats the rows of earlier turns, so only the rows past them are new (the last turn's final token and the
    env tokens after it, then the generated tokens but the last). A generation without routing, or whose rows
    do not fit the tokens it ran (an engine that skipped cached tokens), leaves the episode without routing."""
    ran = len(e.prompt_ids) + len(e.response_ids) + len(gen.token_ids) - 1
    r = gen.routing
    if r is None or r.shape[0] != ran or (e.turns and e.routing is None):
        e.routing = None
        return
    e.routing = r.copy() if e.routing is None else np.concatenate([e.routing, r[e.routing.shape[0] :]])


def _observe(e: _Episode, gen: Generation, result: tuple, tokenizer: Any, sampling: Sampling) -> bool:
    """Take the env's answer to the turn: end the episode, or append the observation tokens.
    Returns whether the rollout ended the episode early (its env's ``finalize`` is then due)."""
    obs, terminated, truncated, info = result
    if isinstance(info, dict) and isinstance(info.get("reward"), (int, float)):
        e.env_reward = float(info["reward"])
    _note_sandbox_events(e, info)
    e.messages = e.messages + [Message("assistant", e.action)] + list(obs)
    e.finish_reason = gen.finish_reason
    cut = gen.finish_reason == "length"
    if terminated or truncated:
        # A final turn cut by max_new_tokens makes a truncated episode, whatever the env concluded.
        e.terminated, e.truncated, e.done = bool(terminated) and not cut, bool(truncated) or cut, True
        return False
    if e.turns >= sampling.max_turns:
        return _end_early(e, "max_turns")
    # The conversation's text now is the old text + exactly what the engine produced. A turn cut
    # by max_new_tokens has no EOS: the template's closing tokens then come as env tokens.
    e.text += tokenizer.decode(gen.token_ids, skip_special_tokens=False)
    full = _render(e, e.messages, tokenizer)
    if not full.startswith(e.text):
        # The template re-renders this turn differently from what the engine produced (e.g. the
        # policy emitted special tokens mid-turn): continuing would desynchronise tokens and text.
        return _end_early(e, "template_mismatch")
    # The env may pre-start the next turn (``info["prefill"]``): env tokens, like the observation before it.
    prefill = info.get("prefill", "") if isinstance(info, dict) else ""
    if not isinstance(prefill, str):
        raise TypeError(f"info['prefill'] must be a str (the next turn's pre-start), got {type(prefill).__name__}")
    delta = encode(tokenizer, full[len(e.text) :] + prefill)
    e.text, e.prefill = full + prefill, prefill
    if len(e.prompt_ids) + len(e.response_ids) + len(delta) + 1 >= sampling.max_model_len:
        return _end_early(e, "max_model_len")
    e.response_ids += delta
    e.loss_mask += [0] * len(delta)
    e.logprobs += [0.0] * len(delta)
    if e.token_versions is not None:
        e.token_versions += [-1] * len(delta)
    return False


def _end_early(e: _Episode, reason: str) -> bool:
    """The rollout ends an episode the env has not ended: truncated; ``_finalize`` then lets the env score it."""
    e.truncated, e.done, e.finish_reason = True, True, reason
    return True


def _finalize(e: _Episode) -> None:
    """The env's optional ``finalize()`` for an episode the rollout ended (self-scoring envs still score it)."""
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
