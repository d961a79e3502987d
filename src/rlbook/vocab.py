"""The character vocabulary shared by the small language models (``rlbook.lm``) and the tasks (``rlbook.tasks``).

Every prompt and every reference answer a task produces is written in ``ALPHABET``; a model may still *generate*
any token, and rewards treat what cannot be parsed as wrong, never as an error.
"""

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)

# Order matters: token ids are positions in SPECIAL_TOKENS + tuple(ALPHABET); never reorder, only append.
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz +-*=,:;.?!()[]<>|/#_'"
