"""The directory ``envs.stacks.child_stacks`` puts first on ``PYTHONPATH``: its ``sitecustomize`` (see there)."""
