"""Scored samples per second for each built-in reward.

For each built-in, synthetic trajectories built from the shipped task files (right,
partly right and malformed answers, mixed) are scored two ways:

* ``direct``: a plain loop of ``reward(traj)`` (the function alone);
* ``scorer``: ``RewardScorer([spec], timeout_s=60).score(trajs)``, the path a reward
  actor of the trainer takes (per-call timeouts on a helper thread, value checks,
  combination). For ``LLMJudge`` the scorer path uses ``acall`` (concurrent requests).

``code_tests`` runs every answer's tests in a fresh bubblewrap sandbox (no env reward
reused); ``llm_judge`` talks to a stub OpenAI-compatible server on 127.0.0.1 (its own
process) that answers after ``--judge-latency-ms`` (default 50): ``direct`` is one
request at a time, ``scorer`` uses ``acall`` with 8 requests in flight.

Usage: .venv/bin/python bench/reward_bench.py [--n 2000] [--code-n 40] [--judge-n 200] [--judge-latency-ms 50]
                                             [--only NAME ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import subprocess
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.io import load_tasks  # noqa: E402
from envs.types import Message, Task, Trajectory  # noqa: E402
from rewards.service import RewardFnSpec, RewardScorer  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "recipes" / "data"


def traj(task: Task, turns: list[Message], n_tokens: int = 32, env_reward: float | None = None) -> Trajectory:
    return Trajectory(
        task=task,
        group_id=0,
        prompt_ids=[1] * 8,
        response_ids=[2] * n_tokens,
        loss_mask=[1] * n_tokens,
        logprobs=[0.0] * n_tokens,
        messages=[*task.messages, *turns],
        terminated=True,
        truncated=False,
        finish_reason="stop",
        num_turns=sum(m.role == "assistant" for m in turns),
        env_reward=env_reward,
    )


def call_text(name: str, args: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def toolcall_trajs(n: int) -> list[Trajectory]:
    tasks = [t for t in load_tasks(DATA / "toolcall_quickstart.eval.jsonl") if t.tool_call and t.tool_call.expected]
    out = []
    for i in range(n):
        t = tasks[i % len(tasks)]
        e = t.tool_call.expected[0]
        right = {k: v[0] for k, v in e.allowed.items() if v and v[0] != ""}
        kind = i % 3
        text = (
            call_text(e.name, right)
            if kind == 0
            else call_text(e.name, {k: "wrong" for k in right})
            if kind == 1
            else "<tool_call>{not json"
        )
        out.append(traj(t, [Message("assistant", text)]))
    return out


def answer_trajs(n: int) -> list[Trajectory]:
    tasks = [t for t in load_tasks(DATA / "toolcall_tasks.jsonl") if t.tool_call and t.tool_call.mode == "answer"]
    out = []
    for i in range(n):
        t = tasks[i % len(tasks)]
        final = f"The answer is {t.tool_call.answer[0]}." if i % 2 == 0 else "I could not find it."
        out.append(
            traj(
                t,
                [
                    Message("assistant", call_text("lookup", {"q": "x"})),
                    Message("tool", "{}", "lookup"),
                    Message("assistant", final),
                ],
            )
        )
    return out


def code_trajs(n: int) -> list[Trajectory]:
    tasks = load_tasks(DATA / "code_tasks.jsonl")
    out = []
    for i in range(n):
        t = tasks[i % len(tasks)]
        code = t.code.solution if i % 2 == 0 else t.code.solution.replace("return", "return None #", 1)
        out.append(traj(t, [Message("assistant", f"Here it is:\n```python\n{code}\n```")]))
    return out


def terminal_trajs(n: int) -> list[Trajectory]:
    tasks = load_tasks(DATA / "terminal_tasks.jsonl")
    return [traj(tasks[i % len(tasks)], [Message("assistant", "ls\nDONE")], env_reward=float(i % 2)) for i in range(n)]


def overlong_trajs(n: int) -> list[Trajectory]:
    base = toolcall_trajs(1)[0]
    return [
        dataclasses.replace(base, response_ids=[2] * (i % 300), loss_mask=[1] * (i % 300), logprobs=[0.0] * (i % 300))
        for i in range(n)
    ]


STUB_SERVER = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

latency = float(sys.argv[1])
body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "Fine. Score: 7/10"}}]}).encode()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(latency)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    request_queue_size = 128  # the default backlog (5) drops concurrent connects (1 s SYN retry)
    daemon_threads = True


server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


class StubJudge:
    """An OpenAI-compatible endpoint on 127.0.0.1, in its own process, answering "Score: 7/10"
    after ``latency_s`` (a stand-in for a judge model's response time)."""

    def __init__(self, latency_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", STUB_SERVER, str(latency_s)], stdout=subprocess.PIPE, text=True
        )
        port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{port}/v1"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def measure(spec: RewardFnSpec, trajs: list[Trajectory]) -> tuple[float, float, int]:
    """(direct samples/s, scorer samples/s, errors in the scorer run)."""
    scorer = RewardScorer([spec], timeout_s=60)
    fn = scorer.fns[0][1]
    fn(trajs[0])  # warm-up (imports, sandbox start)
    t0 = time.perf_counter()
    for t in trajs:
        fn(t)
    direct = len(trajs) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    out = scorer.score(trajs)
    via = len(trajs) / (time.perf_counter() - t0)
    errors = sum(t.reward_error is not None and "no reward function scored" not in t.reward_error for t in out)
    if hasattr(fn, "close"):
        fn.close()
    return direct, via, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="samples for the fast rewards")
    ap.add_argument("--code-n", type=int, default=40, help="samples for code_tests (one sandbox run each)")
    ap.add_argument("--judge-n", type=int, default=200, help="samples for llm_judge (one HTTP request each)")
    ap.add_argument("--judge-latency-ms", type=float, default=50.0, help="the stub judge's response time")
    ap.add_argument("--only", nargs="*", help="names of the rows to run")
    args = ap.parse_args()

    stub = StubJudge(args.judge_latency_ms / 1000)
    rows = [
        ("toolcall", RewardFnSpec("rewards.toolcall.ToolCallReward"), lambda: toolcall_trajs(args.n)),
        ("toolcall_format", RewardFnSpec("rewards.toolcall.ToolCallFormatReward"), lambda: toolcall_trajs(args.n)),
        ("tool_answer", RewardFnSpec("rewards.toolcall.ToolAnswerReward"), lambda: answer_trajs(args.n)),
        (
            "code_tests",
            RewardFnSpec("rewards.code.CodeTestsReward", kwargs={"use_env_reward": False}),
            lambda: code_trajs(args.code_n),
        ),
        ("code_format", RewardFnSpec("rewards.code.CodeFormatReward"), lambda: code_trajs(args.n)),
        ("terminal_check", RewardFnSpec("rewards.terminal.TerminalCheckReward"), lambda: terminal_trajs(args.n)),
        (
            "overlong",
            RewardFnSpec("rewards.format.OverlongPenalty", kwargs={"max_tokens": 256, "buffer_tokens": 64}),
            lambda: overlong_trajs(args.n),
        ),
        (
            f"llm_judge@{args.judge_latency_ms:g}ms",
            RewardFnSpec(
                "rewards.judge.LLMJudge",
                domains=("tool_call",),
                kwargs={
                    "base_url": stub.url,
                    "model": "stub",
                    "prompt_template": "{prompt}\n{completion}",
                    "concurrency": 8,
                },
            ),
            lambda: toolcall_trajs(args.judge_n),
        ),
    ]
    print(f"{'reward':<20} {'samples':>8} {'direct/s':>12} {'scorer/s':>12} {'us/sample':>10} {'errors':>7}")
    try:
        for name, spec, make in rows:
            if args.only and name.split("@")[0] not in args.only:
                continue
            trajs = make()
            direct, via, errors = measure(spec, trajs)
            print(
                f"{name:<20} {len(trajs):>8} {direct:>12,.0f} {via:>12,.0f} {1e6 / via:>10,.1f} {errors:>7}", flush=True
            )
    finally:
        stub.close()
    print(
        "\ndirect: reward(traj) in a loop; scorer: RewardScorer(timeout_s=60).score(trajs) "
        "(llm_judge: acall, 8 concurrent requests)."
    )


if __name__ == "__main__":
    main()
