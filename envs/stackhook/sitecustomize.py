"""Put on ``PYTHONPATH`` by ``envs.stacks.child_stacks`` for the Python processes a run's actor spawns (vLLM's
engine core: a fresh interpreter that runs none of our code first): with ``JOINTRL_STACKS_CHILD`` set, the new
process registers its stack dump (``envs.stacks.register``) as it starts. Not a package module: Python's
``site`` imports it by this name. It then runs the ``sitecustomize`` it shadows, if any, so nothing else changes.
"""

import importlib.util
import os
import sys


def _jointrl_register() -> None:
    name = os.environ.get("JOINTRL_STACKS_CHILD")
    if not name:
        return
    try:
        from envs.stacks import register

        register(name)
    except Exception as e:  # noqa: BLE001 - a dump hook must never stop the process it is for
        print(f"jointrl: stack dump not set up in pid {os.getpid()}: {type(e).__name__}: {e}", file=sys.stderr)


def _shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for p in sys.path:
        f = os.path.join(p or ".", "sitecustomize.py")
        if os.path.abspath(p or ".") != here and os.path.isfile(f):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", f)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_jointrl_register()
_shadowed()
