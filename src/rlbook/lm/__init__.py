"""The language-model substrate: a character tokenizer, tiny Llama/Qwen2 models, saving/loading, devices.

    from rlbook.lm import build_tokenizer, build_model
    tokenizer = build_tokenizer()
    model = build_model("tiny", arch="llama", seed=0)        # 102,592 parameters

Sampling and log-probs of completions live in :mod:`rlbook.rollout`.
"""

from rlbook.lm.device import adamw, autocast, default_device, resolve_device
from rlbook.lm.model import (
    ARCHITECTURES,
    MODEL_SIZES,
    ModelSize,
    build_model,
    count_parameters,
    load_policy,
    save_policy,
)
from rlbook.lm.tokenizer import VOCAB, build_tokenizer, check_tokenizer

__all__ = [
    "ARCHITECTURES",
    "MODEL_SIZES",
    "ModelSize",
    "VOCAB",
    "adamw",
    "autocast",
    "build_model",
    "build_tokenizer",
    "check_tokenizer",
    "count_parameters",
    "default_device",
    "load_policy",
    "resolve_device",
    "save_policy",
]
