#!/usr/bin/env bash
# A separate virtualenv for TRL, used only by bench/vs_trl.py (TRL is not a jointrl dependency
# and never goes into .venv). Idempotent.
#
#   bash bench/setup_trl.sh                # CPU: torch 2.13.0 (the CPU wheel), into bench/.venv-trl
#   TRL_DEVICE=cuda bash bench/setup_trl.sh  # GPU: the CUDA torch build + TRL's vLLM extra (not run: no GPU here)
#
# It installs: torch, transformers at the version .venv has (so both sides load the model the
# same way), trl (TRL_VERSION, default below), and jointrl itself (editable, --no-deps) plus the
# few dependencies its task, env and reward modules import, so the TRL side is trained and
# scored on exactly jointrl's tasks, prompts and reward.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${TRL_VENV:-$ROOT/bench/.venv-trl}
DEVICE=${TRL_DEVICE:-cpu}
# CPU: TRL 1.14.2. From 1.15 on, GRPOTrainer scores log-probs with a chunked fp32 LM head that,
# off Triton devices (CUDA/XPU), runs over every prompt and completion position: on this 2-core
# CPU one 64-completion step of 1.16.0 had not finished after 16 minutes (1.14.2 computes the
# logits of the completion positions only). GPU: the newest release measured against here.
if [ "$DEVICE" = cpu ]; then TRL_VERSION=${TRL_VERSION:-1.14.2}; else TRL_VERSION=${TRL_VERSION:-1.16.0}; fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3.12 python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || { echo "needs Python >= 3.11" >&2; exit 1; }

# transformers: the same version as jointrl's .venv when there is one.
TF_SPEC="transformers>=5.16.1,<5.20"
if [ -x "$ROOT/.venv/bin/python" ]; then
  TF_VERSION=$("$ROOT/.venv/bin/python" -c 'import transformers; print(transformers.__version__)' 2>/dev/null || true)
  [ -n "$TF_VERSION" ] && TF_SPEC="transformers==$TF_VERSION"
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
if [ "$DEVICE" = cpu ]; then
  # Pinned: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 resolves to the CPU wheel here.
  $PIP install -q "torch==2.13.0"
  $PIP install -q "$TF_SPEC" "trl==$TRL_VERSION" "torch==2.13.0" accelerate datasets jsonschema pyyaml safetensors
  # Same breakage as in .venv: PyPI torchvision & co. do not import beside torch+cpu.
  $PIP uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
else
  # GPU: the CUDA torch that vLLM pins, and TRL's vLLM extra for its colocated generation.
  $PIP install -q "$TF_SPEC" "trl[vllm]==$TRL_VERSION" accelerate datasets jsonschema pyyaml safetensors
fi
# jointrl's own modules (tasks, envs, the reward) for the TRL side; its heavy deps (ray, vllm) are not needed there.
$PIP install -q -e "$ROOT" --no-deps
"$VENV/bin/python" -c "import trl, torch, transformers, envs.toolcall, rewards.toolcall, rollout.episode; \
print(f'bench TRL venv ready: {\"$VENV\"}: trl {trl.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')"
