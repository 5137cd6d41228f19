"""Tokenizers: load a Hugging Face one, or train a tiny byte-level BPE for demos.

`train_tokenizer` writes a normal Hugging Face tokenizer directory (tokenizer.json,
tokenizer_config.json with a ChatML chat template) using Qwen's special tokens,
so code that works with it works with Qwen's tokenizer too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # end of a chat turn; the EOS token
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# ChatML, as Qwen2 uses it: <|im_start|>role\ncontent<|im_end|>\n per message.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def load_tokenizer(path: str):
    """`transformers.AutoTokenizer` from a local directory (or a hub id when online), or
    from a GGUF source (a .gguf file, a directory with one, or a preset such as
    "smollm2-135m-instruct"): its converted Hugging Face directory (`gguf_import`)."""
    from transformers import AutoTokenizer

    from jaxrl_agents.models import gguf_import

    if gguf_import.is_gguf_source(path):
        path = gguf_import.resolve(path)
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as err:
        raise OSError(f"could not load a tokenizer from {path!r}: {err}") from err


def train_tokenizer(texts: Iterable[str], vocab_size: int, path: str):
    """Train a byte-level BPE on `texts`, save it to `path`, return the loaded tokenizer.

    The vocabulary holds the 256 byte symbols, the special tokens
    (pad `<|endoftext|>`, `<|im_start|>`, eos `<|im_end|>`) and merges up to
    `vocab_size` in all. Any text encodes (bytes never go unknown).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    minimum = len(alphabet) + len(SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise ValueError(f"train_tokenizer(vocab_size={vocab_size}): needs at least {minimum} "
                         "(256 bytes + special tokens)")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=alphabet, show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token=PAD_TOKEN, eos_token=IM_END,
        additional_special_tokens=[IM_START])
    tokenizer.chat_template = CHAT_TEMPLATE
    os.makedirs(path, exist_ok=True)
    tokenizer.save_pretrained(path)
    return load_tokenizer(path)
