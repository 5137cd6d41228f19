"""Tiny random Hugging Face models and padded batches shared by the model tests."""

import numpy as np
import torch
import transformers

# Llama 3.x RoPE scaling whose bands all fall inside a tiny test: wavelengths above
# 16 / 1 = 16 positions are divided by `factor`, those between 16 / 4 = 4 and 16 smoothed.
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16)
_FAMILIES = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
             "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
             "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}


def make_hf_model(arch="qwen2", *, tie=True, heads=4, kv_heads=2, theta=10000.0, hidden=32,
                  layers=2, vocab=97, head_dim=None, rope_scaling=None, seed=0):
    """A random transformers Qwen2/Qwen3/Llama causal LM; weights drawn with std 0.1 so
    that every term (biases and norm scales included) matters in the logits.
    rope_scaling: extra `rope_parameters` entries (e.g. LLAMA3_ROPE)."""
    kwargs = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden + 8,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, tie_word_embeddings=tie,
                  max_position_embeddings=128, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": theta,
                                   **(rope_scaling or {})})
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    config_cls, cls = _FAMILIES[arch]
    config = config_cls(**kwargs)
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.1 * torch.randn_like(p)
            p.copy_(1.0 + noise if "norm" in name else noise)
    return model


def padded_batch(vocab, seed=0, batch=3, length=7):
    """ids [B, T] int32 and mask [B, T]: row 0 full, row 1 right-padded, row 2 left-padded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, size=(batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    mask[1, length - 3:] = 0
    mask[2, :2] = 0
    ids[mask == 0] = 0
    return ids, mask


def torch_logits(model, ids, mask, positions):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    position_ids=torch.tensor(np.asarray(positions), dtype=torch.long))
    return out.logits.float().numpy()
