"""A character-level tokenizer over :mod:`rlbook.vocab`, as a Hugging Face ``PreTrainedTokenizerFast``.

One character is one token, so a reader can count tokens by eye and every task's answer is a short,
exactly known token sequence. The token ids are the positions in ``SPECIAL_TOKENS + tuple(ALPHABET)``:

    <pad>=0  <bos>=1  <eos>=2  <unk>=3  '0'=4 ... '9'=13  'a'=14 ...

It is a real ``PreTrainedTokenizerFast`` (built from a ``tokenizers`` WordLevel model), so the same code that
drives it also drives the tokenizer of a hub model such as Qwen2.5. Built offline; nothing is downloaded.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rlbook.vocab import ALPHABET, BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, UNK_TOKEN

VOCAB = SPECIAL_TOKENS + tuple(ALPHABET)  # token id -> token string


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer of the book's small models (vocabulary size ``len(VOCAB)`` = 62).

    - Every character is its own token; characters outside ``ALPHABET`` (upper case, newline, ...) become ``<unk>``.
    - Encoding prepends ``<bos>`` (like Llama tokenizers), so even the empty prompt is one token long.
    - ``decode(ids, skip_special_tokens=True)`` inverts ``encode`` on every string over ``ALPHABET``.
    - ``padding_side="left"``: batched prompts end at the same column, so generation continues every row at once.

    Two settings keep the round trip exact. ``split_special_tokens=True``: the text ``"<eos>"`` (all of its
    characters are in ``ALPHABET``) is five characters, never the EOS token. ``clean_up_tokenization_spaces=False``:
    otherwise ``"a , b"`` would decode as ``"a, b"``.
    """
    vocab = {token: i for i, token in enumerate(VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one piece per character
    backend.decoder = decoders.Fuse()  # join the pieces back without separators
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        split_special_tokens=True,
        clean_up_tokenization_spaces=False,
    )


def check_tokenizer(tokenizer: PreTrainedTokenizerBase) -> None:
    """Raise ``ValueError`` unless ``tokenizer`` has the pad and EOS tokens that batched sampling needs.

    The pad token fills the left of short prompts and the right of finished completions; the EOS token ends a
    completion. Many hub tokenizers (Llama's among them) ship without a pad token: set one explicitly, for
    example ``tokenizer.pad_token = tokenizer.eos_token``, which is what TRL does.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer ({type(tokenizer).__name__}) has no EOS token: completions could never end")
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"the tokenizer ({type(tokenizer).__name__}) has no pad token, needed to batch prompts of different "
            "lengths; set one, e.g. `tokenizer.pad_token = tokenizer.eos_token`"
        )
