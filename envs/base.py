"""The environment protocol every jointrl env implements, and helpers around it.

An env runs one episode of one :class:`~envs.types.Task` at a time. The rollout side
(``rollout``) owns the policy and the tokens; the env only sees and returns text
messages. One episode goes::

    messages = env.reset(task)            # the conversation before the policy's first turn
    while True:
        action = <policy's assistant turn>  # full text; its pre-start included (task.prefill on turn 1)
        obs, terminated, truncated, info = env.step(action)
        messages += [Message("assistant", action), *obs]
        if terminated or truncated:
            break
    env.close()

Contract:

``reset(task) -> list[Message]``
    Starts a new episode and returns the conversation before the policy's first turn,
    usually ``list(task.messages)``. Never empty.

``step(action) -> (observation, terminated, truncated, info)``
    ``action`` is the full text of the policy's assistant turn; on the first turn it
    starts with ``task.prefill``. ``observation`` is a list of :class:`Message` to append
    after the assistant message (e.g. tool results with role ``"tool"``); it may be empty.
    ``terminated`` (natural end) and ``truncated`` (turn/time limit) are plain ``bool`` and
    never both True. ``info`` is a ``dict`` of JSON-able diagnostics; an env that scores
    itself puts its reward under ``info["reward"]`` (a float). An env that pre-starts the next
    assistant turn puts that text under ``info["prefill"]`` (a str): the rollout appends it after the
    observation as env tokens, and the next ``action`` starts with it. Calling ``step`` before
    ``reset`` or after the episode ended (terminated or truncated) raises ``RuntimeError``.

``finalize() -> dict`` (optional)
    Called by the rollout when it ends an episode the env had not ended (the context
    length ran out, the chat template could not continue, or the rollout's turn limit
    came first). Returns a final ``info``; an env that scores itself runs its check and
    puts ``info["reward"]`` there, so such an episode is still scored. Envs without it
    simply leave the episode unscored by themselves.

``close() -> None``
    Releases resources (sandboxes, processes). Idempotent: closing twice is fine.

:func:`check_env` verifies this contract on one task; the test suite runs it on every
shipped env. :func:`resolve` turns a dotted path from a config (``"envs.toolcall.ToolCallEnv"``)
into the object.
"""

from __future__ import annotations

import importlib
import numbers
from typing import Any, Protocol, runtime_checkable

from envs.types import Message, Task

__all__ = ["Env", "check_env", "resolve"]


@runtime_checkable
class Env(Protocol):
    """A text-in, messages-out environment. See the module docstring for the contract. An env may also define
    ``seed_episode(seed: int)``: the rollout calls it with the episode's seed before ``reset`` (optional; not
    part of this protocol's runtime check)."""

    def reset(self, task: Task) -> list[Message]:
        """Start an episode; return the conversation before the policy's first turn."""
        ...

    def step(self, action: str) -> tuple[list[Message], bool, bool, dict[str, Any]]:
        """Consume one assistant turn; return (observation, terminated, truncated, info)."""
        ...

    def close(self) -> None:
        """Release resources; idempotent."""
        ...


def _check_messages(value: Any, what: str, *, non_empty: bool) -> None:
    if not isinstance(value, list):
        raise TypeError(f"{what} must be a list of Message, got {type(value).__name__}")
    if non_empty and not value:
        raise AssertionError(f"{what} must be a non-empty list of Message, got []")
    for i, m in enumerate(value):
        if not isinstance(m, Message):
            raise TypeError(f"{what}[{i}] must be a Message, got {type(m).__name__}")


def _check_step_result(result: Any, turn: int) -> tuple[bool, bool]:
    where = f"step() on turn {turn}"
    if not isinstance(result, tuple) or len(result) != 4:
        raise TypeError(
            f"{where} must return a 4-tuple (observation, terminated, truncated, info), got {result!r:.200}"
        )
    obs, terminated, truncated, info = result
    _check_messages(obs, f"{where} observation", non_empty=False)
    if not isinstance(terminated, bool):
        raise TypeError(f"{where}: terminated must be a bool, got {type(terminated).__name__}")
    if not isinstance(truncated, bool):
        raise TypeError(f"{where}: truncated must be a bool, got {type(truncated).__name__}")
    if terminated and truncated:
        raise AssertionError(f"{where}: terminated and truncated are both True")
    if not isinstance(info, dict):
        raise TypeError(f"{where}: info must be a dict, got {type(info).__name__}")
    if "reward" in info:
        r = info["reward"]
        if isinstance(r, bool) or not isinstance(r, numbers.Real):
            raise TypeError(f"{where}: info['reward'] must be a float, got {type(r).__name__}")
    if "prefill" in info and not isinstance(info["prefill"], str):
        raise TypeError(f"{where}: info['prefill'] must be a str, got {type(info['prefill']).__name__}")
    return terminated, truncated


def check_env(env: Any, task: Task, action: str | None = None, max_steps: int = 64) -> None:
    """Check that ``env`` honours the :class:`Env` contract on ``task``.

    Runs one episode with a trivial action (``action``, default ``task.prefill``) until it
    ends or ``max_steps`` steps pass, then checks that stepping a finished episode raises
    ``RuntimeError`` and that ``close()`` can be called twice. Raises ``TypeError`` (wrong
    types) or ``AssertionError`` (wrong behaviour) with a message saying what is wrong.
    """
    name = type(env).__name__
    if not isinstance(env, Env):
        missing = [m for m in ("reset", "step", "close") if not callable(getattr(env, m, None))]
        raise TypeError(f"{name} does not implement the Env protocol (missing: {', '.join(missing)})")
    if action is None:
        action = task.prefill

    _check_messages(env.reset(task), f"{name}.reset()", non_empty=True)

    ended = False
    for turn in range(1, max_steps + 1):
        terminated, truncated = _check_step_result(env.step(action), turn)
        if terminated or truncated:
            ended = True
            break
    if not ended:
        raise AssertionError(f"{name}: episode neither terminated nor truncated after {max_steps} steps")

    try:
        env.step(action)
    except RuntimeError:
        pass
    except Exception as exc:  # noqa: BLE001 - report what was raised instead
        raise AssertionError(
            f"{name}.step() after the episode ended must raise RuntimeError, raised {type(exc).__name__}: {exc}"
        ) from exc
    else:
        raise AssertionError(f"{name}.step() after the episode ended must raise RuntimeError, it returned")

    for i in (1, 2):
        try:
            env.close()
        except Exception as exc:  # noqa: BLE001
            raise AssertionError(
                f"{name}.close() must be idempotent; call {i} raised {type(exc).__name__}: {exc}"
            ) from exc


def resolve(dotted: str) -> Any:
    """Import ``"pkg.mod.Name"`` (or ``"pkg.mod:Name"``) and return the object.

    Attribute chains work too (``"pkg.mod.Class.attr"``). Raises ``ImportError`` naming
    ``dotted`` and the reason when the module or the attribute cannot be found.
    """
    if not isinstance(dotted, str) or not dotted.strip():
        raise ImportError(f"cannot resolve {dotted!r}: expected a dotted path like 'pkg.mod.Name'")
    dotted = dotted.strip()
    if ":" in dotted:
        module_name, _, attr_path = dotted.partition(":")
        candidates = [(module_name, attr_path.split("."))]
    else:
        parts = dotted.split(".")
        if len(parts) < 2:
            raise ImportError(f"cannot resolve {dotted!r}: expected a dotted path like 'pkg.mod.Name'")
        # Longest importable module prefix wins: pkg.mod.Class.attr -> module pkg.mod.
        candidates = [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]

    first_error: BaseException | None = None
    for module_name, attrs in candidates:
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only try a shorter prefix when it is this very module that is missing,
            # not something it imports.
            if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                first_error = first_error or exc
                continue
            raise ImportError(f"cannot resolve {dotted!r}: importing {module_name!r} failed: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - any import-time error
            raise ImportError(
                f"cannot resolve {dotted!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        for i, attr in enumerate(attrs):
            try:
                obj = getattr(obj, attr)
            except AttributeError as exc:
                owner = ".".join([module_name, *attrs[:i]])
                raise ImportError(f"cannot resolve {dotted!r}: {owner!r} has no attribute {attr!r}") from exc
        return obj
    raise ImportError(f"cannot resolve {dotted!r}: {first_error}") from first_error
