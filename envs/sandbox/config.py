"""SandboxConfig: the per-sandbox storage and output defaults an env or reward takes from a recipe.

A recipe sets them through the env's (or reward's) kwargs, e.g.::

    rollout:
      envs:
        - domain: terminal
          cls: envs.terminal.TerminalEnv
          kwargs: {sandbox_config: {storage_mb: 256, storage_inodes: 8192}}

:meth:`SandboxConfig.coerce` turns such a mapping into a validated config and names the
offending key on bad input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SandboxConfig"]

_UID_MAX = (1 << 31) - 1  # bwrap writes its uid map with signed ints: "Invalid argument" above this

_BOUNDS = {
    "storage_mb": (1, 1 << 16),
    "storage_inodes": (64, 10_000_000),
    "output_bytes": (1024, 1 << 30),
    "uid_base": (1 << 16, _UID_MAX),
    "uid_count": (1, 1 << 20),
}


@dataclass(frozen=True)
class SandboxConfig:
    """Per-sandbox storage and output caps (each sandbox gets its own), and the host uid pool."""

    storage_mb: int = 512
    """Size cap (MiB) of the one tmpfs that holds ALL the sandbox's writable places: the work dir, /tmp, /dev/shm."""
    storage_inodes: int = 16384
    """Inode cap of that tmpfs: how many files and directories the sandbox may create in total."""
    output_bytes: int = 1_000_000
    """Captured bytes per stream (stdout, stderr) of one run; the rest is counted and dropped."""
    uid_base: int = 2_000_000_000
    """First host uid of the pool sandboxes lease from when the harness is root (:mod:`envs.sandbox.uids`);
    no real account should use uids in the pool."""
    uid_count: int = 4096
    """How many uids the pool has: the most sandboxes that can be open at once on the host."""

    def __post_init__(self) -> None:
        for name, (lo, hi) in _BOUNDS.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"sandbox_config.{name} must be an int in [{lo}, {hi}], got {v!r}")
        if self.uid_base + self.uid_count - 1 > _UID_MAX:
            raise ValueError(
                f"sandbox_config.uid_base + uid_count - 1 must be <= {_UID_MAX}, got {self.uid_base + self.uid_count - 1}"
            )

    @classmethod
    def coerce(cls, value: SandboxConfig | Mapping[str, Any] | None) -> SandboxConfig:
        """``value`` as a config: None -> defaults, a mapping -> validated fields (unknown keys named)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"sandbox_config must be a mapping of {sorted(_BOUNDS)}, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"sandbox_config: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**dict(value))
