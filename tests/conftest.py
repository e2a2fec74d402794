"""Shared test setup: a per-machine cache for the embedded tiny model, and fixtures for it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Build the embedded tiny model once per machine (not per test or per session): a fixed
# folder under the temp dir, unless the caller chose a cache already.
os.environ.setdefault("JOINTRL_CACHE", str(Path(tempfile.gettempdir()) / "jointrl-test-cache"))
# Tests never log to a W&B server, even where an API key is configured.
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """Local HF folder of ``embedded:tiny`` (a ~1M-param Qwen2 with a ChatML tokenizer)."""
    from rl.models import resolve_model

    return resolve_model("embedded:tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)
