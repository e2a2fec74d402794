"""The tool-call workload that bench/vs_trl.py and bench/overhead.py measured (bench/RESULTS.md).

Both benches take their model and algorithm from ``recipes/quickstart.yaml``; these ``key=value``
overrides pin the rest of the workload as it was when they were measured, since the quickstart
has moved on (the tool-call ladder, stop strings, per-argument credit): the schema-prompt tasks
of ``rl.data.tasks.toolcall_gen``, no stop strings (TRL's side and the bare ``generate`` part have
none), temperature 1, all-or-nothing argument credit.
"""

SCHEMA_TOOLCALL = [
    "data.train_files=[data/toolcall_quickstart.train.jsonl]",
    "data.eval_files=[data/toolcall_quickstart.eval.jsonl]",
    "rollout.envs=[{domain: tool_call}]",
    "rollout.temperature=1.0",
    "rewards=[{cls: rewards.toolcall.ToolCallReward, domains: [tool_call],"
    " kwargs: {format_weight: 0.2, name_weight: 0.3, args_weight: 0.5}}]",
]
