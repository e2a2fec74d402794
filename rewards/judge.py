"""An LLM-as-judge reward for any OpenAI-compatible chat endpoint (stdlib HTTP only).

:class:`LLMJudge` fills ``prompt_template`` from the trajectory, posts it to
``{base_url}/chat/completions``, and parses a score from the reply with
``score_regex``.

Injection: the completion is the policy's text, and the policy is an adversary. It is handed
to the judge between delimiters that carry a fresh random tag per request (nothing in the
completion can close them), with every verdict-like text in it (a ``score_regex`` match)
masked, and the verdict is read from one fixed place: the LAST non-empty line of the
judge's reply, which must hold exactly one ``score_regex`` match. A completion that writes
``Score: 10/10`` (hoping the judge quotes it, or that a scan of the reply finds it) gets no
credit from it. Failures raise (HTTP errors after ``max_retries`` retries, a reply
without a score, a score outside [0, 1]) so that the reward service records an error
for the sample -- a judge outage never becomes a silent 0.

Recipe example (the judge has no default domains; list them)::

    rewards:
      - cls: rewards.judge.LLMJudge
        weight: 0.5
        domains: [tool_call]
        kwargs:
          base_url: http://127.0.0.1:8000/v1
          model: my-judge
          prompt_template: "Task: {prompt}\\nAnswer: {completion}\\nRate it. End with 'Score: N/10'."
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import os
import re
import secrets
import string
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPException
from typing import Any

from envs.types import Trajectory

__all__ = ["LLMJudge", "JudgeError", "TEMPLATE_FIELDS", "DEFAULT_SCORE_REGEX", "VERDICT_MASK"]

# "Score: 7", "score = 7/10", "SCORE: 0.5 / 1"; read from the reply's last non-empty line only.
DEFAULT_SCORE_REGEX = r"(?i)score\s*[:=]?\s*\**\s*(-?\d+(?:\.\d+)?)(?:\s*/\s*(\d+(?:\.\d+)?))?"
TEMPLATE_FIELDS = ("prompt", "conversation", "completion", "task_id", "domain", "reference", "meta")
RETRY_STATUS = (408, 409, 425, 429, 500, 502, 503, 504)
# What a verdict-like text in the completion is replaced with before the judge sees it.
VERDICT_MASK = "[verdict-like text removed]"


class JudgeError(RuntimeError):
    """The judge endpoint failed or its reply could not be scored."""


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LLMJudge:
    """Score = the judge model's rating of the completion, scaled to [0, 1].

    ``prompt_template`` is a :meth:`str.format` template with the fields ``{prompt}`` (the
    task's last user message), ``{conversation}`` (the task's messages, one
    ``role: content`` block each), ``{completion}`` (``traj.completion``: every assistant
    turn, prefill included, between the lines ``<completion TAG>`` and ``</completion TAG>``
    where TAG is a fresh random hex string per request that the completion does not contain,
    and with each ``score_regex`` match in it replaced by :data:`VERDICT_MASK`), ``{task_id}``, ``{domain}``, ``{reference}`` (the task's
    ``meta["reference"]``, or ``""``) and ``{meta}`` (the task's meta as JSON). Literal
    braces are doubled (``{{`` ``}}``).

    The request is ``{"model", "messages": [system?, user], "temperature", "max_tokens"}``
    (plus ``extra_body``), with ``Authorization: Bearer $<api_key_env>`` when that
    variable is set. Connection errors, timeouts and HTTP 408/409/425/429/5xx are retried
    ``max_retries`` times (backoff ``retry_backoff_s * 2**attempt``); other HTTP errors
    fail at once. Each request waits at most ``timeout_s``.

    The score is read from the reply's LAST non-empty line, which must hold exactly one match
    of ``score_regex`` (ask the judge to end with it): group 1 is the number, an optional
    group 2 a denominator (``"7/10"``); without one the number is divided by ``scale``. The
    result must lie in [0, 1]. A last line with no match or several, or a value outside
    [0, 1], raises :class:`JudgeError` (the sample gets a recorded error, never a score
    taken from elsewhere in the reply).

    ``acall`` (used by the reward service) runs the same request on a pool of
    ``concurrency`` threads, so that up to ``concurrency`` requests are in flight at once. The service's per-call timeout
    (``reward_service.timeout_s``) should exceed ``(max_retries + 1) * timeout_s``
    plus the backoff, or the service gives up first.
    """

    name = "llm_judge"
    domains: tuple[str, ...] = ()  # no default: list the domains in the recipe

    def __init__(
        self,
        base_url: str,
        model: str,
        prompt_template: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 30.0,
        max_retries: int = 2,
        score_regex: str = DEFAULT_SCORE_REGEX,
        scale: float = 10.0,
        system_prompt: str = "",
        temperature: float = 0.0,
        max_tokens: int = 256,
        retry_backoff_s: float = 0.5,
        concurrency: int = 8,
        name: str = "",
        extra_body: dict[str, Any] | None = None,
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty string")
        _check_template(prompt_template)
        self.score_re = _score_regex(score_regex)
        _check_limits(timeout_s, scale, max_retries, concurrency)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.prompt_template = prompt_template
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.scale = float(scale)
        self.system_prompt = system_prompt
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.retry_backoff_s = float(retry_backoff_s)
        self.concurrency = concurrency
        self.extra_body = dict(extra_body or {})
        if name:
            self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        # Loopback endpoints never go through an HTTP proxy from the environment.
        self._opener = (
            urllib.request.build_opener(urllib.request.ProxyHandler({}))
            if _is_loopback(self.url)
            else urllib.request.build_opener()
        )

    # ------------------------------------------------------------------ the reward

    def __call__(self, traj: Trajectory) -> float:
        reply = self.complete(self.render(traj))
        return self.parse_score(reply)

    async def acall(self, traj: Trajectory) -> float:
        # Blocking HTTP on this judge's own pool: `concurrency` requests in flight (asyncio's
        # default pool would cap them at a few threads on a small machine).
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="llm-judge")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.__call__, traj)

    # ------------------------------------------------------------------ parts

    def render(self, traj: Trajectory) -> str:
        """The judge prompt for ``traj`` (its completion delimited and masked, see the class docstring)."""
        task = traj.task
        users = [m.content for m in task.messages if m.role == "user"]
        fields = {
            "prompt": users[-1] if users else "",
            "conversation": "\n\n".join(f"{m.role}: {m.content}" for m in task.messages),
            "completion": self.delimit(traj.completion),
            "task_id": task.id,
            "domain": task.domain,
            "reference": str(task.meta.get("reference", "")),
            "meta": json.dumps(task.meta, ensure_ascii=False, sort_keys=True),
        }
        return self.prompt_template.format_map(fields)

    def delimit(self, completion: str) -> str:
        """``completion`` with its verdict-like texts masked, between delimiters tagged with a
        fresh random hex string it does not contain (so it cannot close them)."""
        masked = self.score_re.sub(VERDICT_MASK, completion)
        tag = secrets.token_hex(8)
        while tag in masked:  # pragma: no cover - 64 random bits
            tag = secrets.token_hex(8)
        return f"<completion {tag}>\n{masked}\n</completion {tag}>"

    def parse_score(self, reply: str) -> float:
        """The score in [0, 1] from the last non-empty line of the judge's ``reply``; raises
        :class:`JudgeError` when that line holds no verdict or more than one."""
        lines = [ln for ln in reply.splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        matches = list(self.score_re.finditer(last))
        if len(matches) != 1:
            what = "no score" if not matches else f"{len(matches)} scores"
            raise JudgeError(
                f"the judge reply's last line holds {what} matching {self.score_re.pattern!r} "
                f"(the verdict is read there only): {last[:200]!r}"
            )
        m = matches[0]
        num = float(m.group(1))
        den_s = m.group(2) if self.score_re.groups >= 2 else None
        den = float(den_s) if den_s else self.scale
        if den <= 0:
            raise JudgeError(f"judge score {m.group(0)!r} has a zero denominator")
        value = num / den
        if not 0.0 <= value <= 1.0:
            raise JudgeError(f"judge score {m.group(0)!r} is outside [0, 1] (scale {den:g})")
        return value

    def complete(self, prompt: str) -> str:
        """The judge model's reply to ``prompt`` (retrying transient failures)."""
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
            {"role": "user", "content": prompt}
        ]
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            **self.extra_body,
        }
        data = self._post(body)
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"unexpected response from {self.url}: {json.dumps(data)[:300]}") from None
        if not isinstance(content, str):
            raise JudgeError(f"unexpected response from {self.url}: message content is {type(content).__name__}")
        return content

    def _post(self, body: dict[str, Any]) -> Any:
        payload = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        err = ""
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            req = urllib.request.Request(self.url, data=payload, headers=headers, method="POST")
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    raw = resp.read()
                try:
                    return json.loads(raw)
                except json.JSONDecodeError:
                    raise JudgeError(f"response from {self.url} is not JSON: {raw[:200]!r}") from None
            except urllib.error.HTTPError as e:
                detail = e.read()[:300].decode("utf-8", "replace") if e.fp is not None else ""
                err = f"HTTP {e.code} from {self.url}: {detail}".rstrip(": ")
                if e.code not in RETRY_STATUS:
                    raise JudgeError(err) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, HTTPException, OSError) as e:
                reason = getattr(e, "reason", e)
                err = f"request to {self.url} failed: {type(reason).__name__}: {reason}"
            if attempt + 1 < attempts:
                time.sleep(self.retry_backoff_s * 2**attempt)
        raise JudgeError(f"{err} (after {attempts} attempt{'s' if attempts > 1 else ''})")


def _check_template(prompt_template: str) -> None:
    """A non-empty :meth:`str.format` template whose fields are all in ``TEMPLATE_FIELDS``."""
    if not isinstance(prompt_template, str) or not prompt_template.strip():
        raise ValueError("prompt_template must be a non-empty string")
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(prompt_template) if f is not None}
    except ValueError as e:
        raise ValueError(f"prompt_template is not a valid format string: {e}") from None
    for f in names:
        root = re.split(r"[.\[]", f, maxsplit=1)[0]
        if root not in TEMPLATE_FIELDS:
            raise ValueError(
                f"prompt_template field {{{f}}} is unknown; available: "
                f"{', '.join('{' + x + '}' for x in TEMPLATE_FIELDS)} (write {{{{ }}}} for braces)"
            )


def _score_regex(score_regex: str) -> re.Pattern[str]:
    """``score_regex`` compiled; it needs a capturing group for the number."""
    try:
        pattern = re.compile(score_regex)
    except re.error as e:
        raise ValueError(f"score_regex does not compile: {e}") from None
    if pattern.groups < 1:
        raise ValueError("score_regex needs a capturing group for the number")
    return pattern


def _check_limits(timeout_s: float, scale: float, max_retries: int, concurrency: int) -> None:
    """``timeout_s`` and ``scale`` positive numbers, ``max_retries`` an int >= 0, ``concurrency`` an int >= 1."""
    for label, v, lo in (("timeout_s", timeout_s, 0.0), ("scale", scale, 0.0)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= lo:
            raise ValueError(f"{label} must be a number > {lo:g}, got {v!r}")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
