"""A tiny trained byte-level BPE: save / load round trip, special tokens, chat template."""

import pytest

from jaxrl_agents.models.tokenizer import (
    IM_END,
    IM_START,
    PAD_TOKEN,
    load_tokenizer,
    train_tokenizer,
)

TEXTS = ["You are in the kitchen. There is an apple on the table.",
         "take apple from table", "open the fridge", "go north", "You win!"] * 20


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok"))
    return path, train_tokenizer(TEXTS, vocab_size=300, path=path)


def test_round_trip_and_special_tokens(trained):
    path, tok = trained
    again = load_tokenizer(path)
    assert len(again) == len(tok) <= 300
    for text in ["take apple from table", "ünïcödé & emoji 🍎 never seen"]:
        ids = again.encode(text, add_special_tokens=False)
        assert ids == tok.encode(text, add_special_tokens=False)
        assert again.decode(ids) == text
    assert again.pad_token == PAD_TOKEN and again.eos_token == IM_END
    specials = {again.convert_tokens_to_ids(t) for t in (PAD_TOKEN, IM_START, IM_END)}
    assert len(specials) == 3 and max(specials) < len(again)
    im_start_id = again.convert_tokens_to_ids(IM_START)
    assert again.encode(IM_START, add_special_tokens=False) == [im_start_id]


def test_chat_template(trained):
    path, _ = trained
    tok = load_tokenizer(path)
    messages = [{"role": "system", "content": "Play the game."},
                {"role": "user", "content": "You are in the kitchen."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nPlay the game.<|im_end|>\n"
                    "<|im_start|>user\nYou are in the kitchen.<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    assert tok.decode(ids) == text[: -len("<|im_start|>assistant\n")]


def test_too_small_vocab_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_tokenizer(TEXTS, vocab_size=100, path=str(tmp_path))
