"""Tiny Hugging Face causal language models (Llama and Qwen2 architectures), and saving/loading a policy.

The book trains real ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` models, only small: 0.1M to 10M parameters over
the 62-token character vocabulary of :mod:`rlbook.lm.tokenizer`. Everything that works on them (sampling,
log-probs, the losses) works unchanged on a hub model such as ``Qwen/Qwen2.5-0.5B`` loaded with
:func:`load_policy`, for readers with a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.utils import logging as hf_logging

from rlbook.lm.device import resolve_device
from rlbook.lm.tokenizer import build_tokenizer, check_tokenizer


@dataclass(frozen=True)
class ModelSize:
    """The shape of a decoder-only transformer (the fields keep their Hugging Face config names).

    ``num_key_value_heads < num_attention_heads`` is grouped-query attention, as in Llama 3 and Qwen2.5.
    ``tie_word_embeddings``: the output layer reuses the input embedding matrix (Qwen2.5-0.5B does too).
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int  # width of the SwiGLU MLP
    max_position_embeddings: int = 512  # longest prompt + completion; RoPE has no parameters, so this is free
    tie_word_embeddings: bool = True


# Parameter counts with the 62-token vocabulary (tests/test_lm.py checks them):
#   tiny   llama 102,592   qwen2 102,848   (head dim 16)
#   small  llama 992,128   qwen2 993,152   (head dim 32)
#   base   llama 10,350,720  qwen2 10,354,560  (head dim 64)
# Qwen2 differs from Llama only by biases on the q, k, v projections (at these sizes, and for our purposes).
MODEL_SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=192),
    "small": ModelSize(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=512),
    "base": ModelSize(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2,
                      intermediate_size=1152),
}

ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    # A mixture of experts (the architecture of Qwen3-30B-A3B, which GSPO was trained on): every MLP is replaced by
    # num_experts SwiGLU experts, and a linear router sends each token to its num_experts_per_tok best ones
    # (rlbook.lm.moe reads those choices). Tiny defaults below; the config's own (128 experts) would be huge here.
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
}

# Config defaults per architecture, applied before the caller's overrides. moe_intermediate_size 96: the two
# experts a token uses have the dense "tiny" MLP's width (192) between them.
ARCH_DEFAULTS: dict[str, dict] = {
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96, norm_topk_prob=True),
}


def build_model(
    size: str | ModelSize = "tiny",
    arch: str = "llama",
    seed: int = 0,
    tokenizer: PreTrainedTokenizerBase | None = None,
    device: str | torch.device = "cpu",
    **overrides,
) -> PreTrainedModel:
    """A freshly initialised causal LM of a named size (``"tiny"``, ``"small"``, ``"base"``) and architecture.

    ``seed`` fixes the initial weights (the global torch RNG is left as it was). ``tokenizer`` (default: the
    character tokenizer) sets the vocabulary size and the pad/bos/eos ids in the config. ``overrides`` replace
    fields of the size (``num_hidden_layers=1``) or are passed on to the config (``attn_implementation="eager"``).
    The model is returned in eval mode (no dropout either way: these configs have none), on ``device``: the CPU
    unless asked otherwise, so that a chapter gives the same numbers everywhere (CUDA draws other random numbers;
    and a model this small is unlikely to be faster on a GPU: not measured, no GPU has run this code).
    """
    if isinstance(size, str):
        if size not in MODEL_SIZES:
            raise ValueError(f"unknown model size {size!r}; choose one of {sorted(MODEL_SIZES)} or pass a ModelSize")
        size = MODEL_SIZES[size]
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    tokenizer = build_tokenizer() if tokenizer is None else tokenizer
    check_tokenizer(tokenizer)

    size_fields = {f.name for f in dataclasses.fields(ModelSize)}
    size = dataclasses.replace(size, **{k: v for k, v in overrides.items() if k in size_fields})
    extra = {k: v for k, v in overrides.items() if k not in size_fields}
    if size.hidden_size % size.num_attention_heads or size.num_attention_heads % size.num_key_value_heads:
        raise ValueError(
            f"hidden_size ({size.hidden_size}) must be divisible by num_attention_heads ({size.num_attention_heads}), "
            f"and that by num_key_value_heads ({size.num_key_value_heads})"
        )

    config_cls, model_cls = ARCHITECTURES[arch]
    config = config_cls(**{
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        **dataclasses.asdict(size),
        **ARCH_DEFAULTS.get(arch, {}),
        **extra,  # may override any of the above, e.g. vocab_size=151_936 to try a real vocabulary's cost
    })
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's random stream
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.to(device).eval()


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count only the real tokens of each row: 0, 1, 2, ... from its first 1 in ``attention_mask``
    (B, L), so that a left-padded row sees the positions it would see unpadded; padding gets 0 (it is masked)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (a tied embedding/output matrix counts once)."""
    return sum(p.numel() for p in model.parameters())


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike) -> Path:
    """Write ``model`` (safetensors + config) and ``tokenizer`` into the directory ``path``; return it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with _no_progress_bars():
        model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@contextlib.contextmanager
def _no_progress_bars():
    """Silence transformers' "Writing model shards" / "Loading weights" bars (they clutter notebook outputs)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# A hub id is "name" or "owner/name"; anything else (/abs, ./rel, ~/x, a/b/c) can only be a local path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def load_policy(
    name_or_path: str | os.PathLike,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` from a directory written by :func:`save_policy`, or from the Hugging Face Hub.

    A hub name such as ``"Qwen/Qwen2.5-0.5B"`` needs network access (the Makefile sets ``HF_HUB_OFFLINE=1``, so
    the book and the tests never download anything). ``dtype`` (e.g. ``torch.bfloat16``) is the weights' dtype;
    ``None`` keeps the stored one. The tokenizer is switched to left padding, and must have pad and EOS tokens
    (``ValueError`` otherwise). ``device=None`` means :func:`~rlbook.lm.device.default_device`.
    """
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} is a file; load_policy expects the directory written by save_policy")
    if not path.is_dir() and not _HUB_ID.match(name):
        raise FileNotFoundError(f"no saved policy at {path}: the directory does not exist")
    source = str(path) if path.is_dir() else name
    try:
        tokenizer = _load_tokenizer(source)
        with _no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(source, **({"dtype": dtype} if dtype is not None else {}))
    except OSError as err:
        where = f"the directory {path}" if path.is_dir() else f"the Hugging Face Hub name {name!r}"
        raise OSError(
            f"could not load a policy from {where} (a hub name needs network access; HF_HUB_OFFLINE=1 forbids it)"
        ) from err
    check_tokenizer(tokenizer)
    tokenizer.padding_side = "left"
    return model.to(resolve_device(device)).eval(), tokenizer


def _load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``source``, loaded as the class it was saved as.

    Why not simply ``AutoTokenizer``: transformers 5 chooses the tokenizer class from the *model* type, so next to
    a Qwen2 model it wraps our character-level ``tokenizer.json`` in a ``Qwen2Tokenizer``, whose byte-level
    pre-tokenizer silently drops every space ("a , b" -> "a,b"). A generic fast tokenizer is loaded as such.
    """
    config_file = Path(source) / "tokenizer_config.json"
    if config_file.is_file():
        saved_class = json.loads(config_file.read_text()).get("tokenizer_class")
        if saved_class in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return PreTrainedTokenizerFast.from_pretrained(source)
    return AutoTokenizer.from_pretrained(source)
