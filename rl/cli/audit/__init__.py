"""``jointrl audit``: try answers that do none of a task's work against the recipe's envs and rewards.

A policy optimises whatever its reward pays for, and finds a reward that pays a wrong answer
before it finds the task's skill. ``jointrl audit TASKS --recipe R`` plays a catalogue of such
answers (:mod:`rl.cli.audit.strategies`: the no-op, constants of each type, the prompt's example
echoed, everything deleted, candidates enumerated, the prompt repeated, oversized and deeply
nested outputs, forged check inputs, and per domain a well-formed answer with wrong content)
through each task's env and the recipe's reward classes, the code path ``jointrl score`` and
training use, and flags every answer that scores above the task's baseline, plus every reference
solution that scores below 1 (:mod:`rl.cli.audit.runner`). Task files are read by a task source
(:mod:`rl.cli.audit.sources`), a plug-in so that other task formats add their own.

Modules: ``sources`` (task-source protocol and registry), ``strategies`` (the catalogue, a
registry per domain), ``runner`` (episodes, baselines, findings), ``command`` (the CLI).
"""
