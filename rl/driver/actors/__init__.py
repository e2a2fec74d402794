"""The Ray edge: every Ray actor wrapper of a run, and the only package of ``rl``, ``rollout``, ``rewards`` and
``envs`` that imports Ray (``tests/test_layering.py`` checks it).

Each wrapper runs N plain classes, which import nothing of Ray and are tested in-process, as Ray actors:

* :mod:`.group`: ``ActorGroup`` (spawn N actors with per-actor options, replace one by index, count restarts),
  ``ray_factory``, ``actor_died``;
* :mod:`.rollout`: ``RolloutPool`` over ``rollout.pool.RolloutWorker`` (vLLM engine + envs);
* :mod:`.rewards`: ``RewardService`` over ``rewards.service.RewardScorer``;
* :mod:`.learners`: ``LearnerGroup`` over ``rl.trainer.learner.Learner`` (data-parallel ranks);
* :mod:`.placement`: the placement groups of ``rl.driver.placement``'s plan, and where each actor landed;
* :mod:`.cluster`: connecting to (or starting) Ray, tasks pinned to a node (stack dumps, shared-memory sweeps,
  Hub prefetch), stopping Ray.

Everything that crosses an actor call is a typed record (``envs.types``, ``rl.algos.batch.Batch``,
``rewards.service.ScoreResult``, the weight records of ``rollout.weights``). The driver reaches these modules only
through ``rl.driver.ray_runtime.RayRuntime`` (and the CLI only through the runtimes).
"""
