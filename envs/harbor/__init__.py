"""Harbor-format tasks (Terminal-Bench style): task directories, their images built without Docker, episodes.

``envs.harbor.task`` reads task directories (``load_task``, ``load_tasks``); ``envs.harbor.dockerfile`` parses and
plans the Dockerfile subset; ``envs.harbor.image`` builds and caches each task's root filesystem
(``build_image``). docs/envs.md#harbor-tasks describes the format read, the bases and the cache.
"""
