"""One Flax NNX decoder for the Qwen2 / Qwen2.5, Qwen3 and Llama (up to 3.x) families.

Token embedding, RoPE (optionally with Llama 3 frequency scaling), RMSNorm,
grouped-query attention (optional q/k/v bias, or per-head q/k RMSNorm), SwiGLU MLP,
tied or untied output embedding. Weights keep the Hugging Face orientation
(`[out_features, in_features]`) so checkpoints load without transposes, and every
parameter carries logical axis names (`out_sharding` metadata) that
`jaxrl_agents.sharding` maps onto the mesh.

Shape letters: B batch, T query length, S key length (T, or the cache length),
D hidden size, V vocab, N query heads, K kv heads, G = N // K, H head dim,
F MLP size, L layers.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_agents.models import lora
from jaxrl_agents.models.config import ModelConfig

_MASKED = -1e30  # added to masked attention scores (finite: no NaN on empty rows)


def _param(rngs: nnx.Rngs, shape, axes, dtype, init="normal") -> nnx.Param:
    """A parameter with logical axis names; placement on a mesh is done later."""
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:
        value = (0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def _dense(module: nnx.Module, name: str, x_bti, dtype):
    """x @ W^T for `module`'s weight `name` ([out, in]) in `dtype`, plus the weight's LoRA
    adapter delta when it has one (models/lora.py). [B, T, in] -> [B, T, out]."""
    y = matmul_wt(x_bti, getattr(module, name)[...].astype(dtype))
    return lora.add_delta(module, name, x_bti, y)


def matmul_wt(x_ni, w_oi, preferred_element_type=None):
    """x @ w^T: [..., in] x [out, in] -> [..., out], as one 2-D matrix product.

    Folding the leading axes into one first matters on CPU: XLA lowers a 3-D einsum's
    backward (the weight gradient contracts over two axes) to a slower contraction than
    a plain GEMM, which made an MLP's forward + backward 1.6x slower at SmolLM2's shape.
    """
    lead, i = x_ni.shape[:-1], x_ni.shape[-1]
    y = jax.lax.dot_general(x_ni.reshape(-1, i), w_oi, (((1,), (1,)), ((), ())),
                            preferred_element_type=preferred_element_type)
    return y.reshape(*lead, w_oi.shape[0])


# ----------------------------------------------------------------------------- maths


def rms_norm(x_btd, scale_d, eps):
    """x / sqrt(mean(x^2) + eps) * scale, computed in float32, returned in x's dtype."""
    x32 = x_btd.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (scale_d.astype(jnp.float32) * x32).astype(x_btd.dtype)


def rope_inv_freq(head_dim: int, theta: float):
    """RoPE inverse frequencies [H/2]: theta^(-2i/H) for i < H/2, in float32."""
    return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def llama3_inv_freq(inv_freq_h, factor, low_freq_factor, high_freq_factor, original_len):
    """Llama 3.x scaled inverse frequencies [H/2] (transformers' `_compute_llama3_parameters`).

    With wavelength w = 2 pi / f, low = original_len / low_freq_factor and
    high = original_len / high_freq_factor (high < low):
        w < high:         f                                  (kept)
        w > low:          f / factor
        otherwise:        (1 - s) f / factor + s f,  s = (original_len / w - low_freq_factor)
                                                         / (high_freq_factor - low_freq_factor)
    """
    low, high = original_len / low_freq_factor, original_len / high_freq_factor
    wavelen = 2 * jnp.pi / inv_freq_h
    scaled = jnp.where(wavelen > low, inv_freq_h / factor, inv_freq_h)
    smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    return jnp.where((wavelen >= high) & (wavelen <= low), smoothed, scaled)


def rope_tables(positions_bt, cfg: ModelConfig):
    """cos and sin tables [B, T, H] for rotate-half RoPE (the Hugging Face layout), with
    `cfg.rope_scaling` (Llama 3.x) applied to the frequencies when set."""
    inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta)  # (H/2,)
    scaling = cfg.rope_scaling
    if scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, scaling.factor, scaling.low_freq_factor,
                                   scaling.high_freq_factor,
                                   scaling.original_max_position_embeddings)
    angles = positions_bt.astype(jnp.float32)[..., None] * inv_freq  # (B, T, H/2)
    angles = jnp.concatenate([angles, angles], axis=-1)  # (B, T, H)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_btnh, cos_bth, sin_bth):
    """x * cos + rotate_half(x) * sin, in float32; returns x's dtype."""
    x32 = x_btnh.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-second, first], axis=-1)
    out = x32 * cos_bth[:, :, None, :] + rotated * sin_bth[:, :, None, :]
    return out.astype(x_btnh.dtype)


def attend(q_btnh, k_bskh, v_bskh, mask_bts):
    """Grouped-query softmax attention; mask_bts is True where query t may see key s.

    Returns [B, T, N, H]. Scores and softmax are float32. Both matmuls run batched over
    (B, K) with each kv head's G query heads stacked along the rows ([B, K, G*T, H]): plain
    batched GEMMs, which XLA:CPU runs (forward and backward) faster than the 5-D einsum.
    The softmax is normalised after the value matmul, on [B, K, G, T, H] instead of the
    [B, K, G, T, S] weights: the same result with S / H times fewer divisions.
    """
    b, t, n, h = q_btnh.shape
    k = k_bskh.shape[2]
    g = n // k
    q = q_btnh.reshape(b, t, k, g, h).transpose(0, 2, 3, 1, 4).reshape(b, k, g * t, h)
    keys = k_bskh.transpose(0, 2, 1, 3)  # (B, K, S, H)
    values = v_bskh.transpose(0, 2, 1, 3)  # (B, K, S, H)
    scores = jax.lax.dot_general(q, keys, (((3,), (3,)), ((0, 1), (0, 1))),
                                 preferred_element_type=jnp.float32)  # (B, K, G*T, S)
    scores = scores.reshape(b, k, g, t, -1)
    scores = jnp.where(mask_bts[:, None, None, :, :], scores * (h ** -0.5), _MASKED)
    top = jax.lax.stop_gradient(scores.max(axis=-1, keepdims=True))
    weights = jnp.exp(scores - top)  # (B, K, G, T, S), unnormalised
    total = weights.sum(axis=-1)  # (B, K, G, T)
    out = jax.lax.dot_general(weights.astype(v_bskh.dtype).reshape(b, k, g * t, -1), values,
                              (((3,), (2,)), ((0, 1), (0, 1))),
                              preferred_element_type=jnp.float32)  # (B, K, G*T, H)
    out = out.reshape(b, k, g, t, h) / total[..., None]
    return out.astype(v_bskh.dtype).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def causal_attend(q_btnh, k_btkh, v_btkh, mask_btt, block: int = 128):
    """`attend` for causal self-attention, skipping key blocks above the diagonal.

    Queries go in blocks of `block` rows; block i only scores keys [0, (i+1)*block),
    which all later keys are causally masked from anyway: about half the work
    of the full [T, T] scores for long T. Same result as `attend`.
    """
    t = q_btnh.shape[1]
    if t <= block or t % block:
        return attend(q_btnh, k_btkh, v_btkh, mask_btt)
    outs = []
    for start in range(0, t, block):
        end = start + block
        outs.append(attend(q_btnh[:, start:end], k_btkh[:, :end], v_btkh[:, :end],
                           mask_btt[:, start:end, :end]))
    return jnp.concatenate(outs, axis=1)  # (B, T, N, H)


def causal_padding_mask(attention_mask_bt):
    """[B, T, T] mask: key s is visible from query t when s <= t and s is a real token."""
    t = attention_mask_bt.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    return causal[None] & attention_mask_bt[:, None, :].astype(bool)


def default_positions(attention_mask_bt):
    """Positions that count real tokens only: left padding does not shift them."""
    mask = attention_mask_bt.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)


# ----------------------------------------------------------------------------- layers


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype, *, rngs: nnx.Rngs):
        self.weight = _param(rngs, (dim,), ("embed",), dtype, init="ones")
        self.eps = eps

    def __call__(self, x_btd):
        return rms_norm(x_btd, self.weight[...], self.eps)


class Attention(nnx.Module):
    """GQA self-attention. Weights: q [N*H, D], k/v [K*H, D], o [D, N*H]; with qk_norm
    (Qwen3) the RMSNorm scales q_norm, k_norm [H], shared by all heads."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        pd = cfg.jnp_param_dtype
        self.q_proj = _param(rngs, (n * h, d), ("heads", "embed"), pd)
        self.k_proj = _param(rngs, (k * h, d), ("kv_heads", "embed"), pd)
        self.v_proj = _param(rngs, (k * h, d), ("kv_heads", "embed"), pd)
        self.o_proj = _param(rngs, (d, n * h), ("embed", "heads"), pd)
        if cfg.qkv_bias:
            self.q_bias = _param(rngs, (n * h,), ("heads",), pd, init="zeros")
            self.k_bias = _param(rngs, (k * h,), ("kv_heads",), pd, init="zeros")
            self.v_bias = _param(rngs, (k * h,), ("kv_heads",), pd, init="zeros")
        if cfg.qk_norm:
            self.q_norm = _param(rngs, (h,), ("head_dim",), pd, init="ones")
            self.k_norm = _param(rngs, (h,), ("head_dim",), pd, init="ones")
        self.cfg = cfg

    def _project(self, x_btd, name, bias, heads):
        dt = self.cfg.jnp_dtype
        y = _dense(self, name, x_btd, dt)  # (B, T, heads*H)
        if bias is not None:
            y = y + bias[...].astype(dt)
        return y.reshape(*y.shape[:2], heads, self.cfg.head_dim)  # (B, T, heads, H)

    def qkv(self, x_btd, cos_bth, sin_bth):
        """Rotated queries [B, T, N, H] and keys, values [B, T, K, H] (with qk_norm,
        queries and keys are RMS-normalised per head before the rotation)."""
        cfg = self.cfg
        bias = cfg.qkv_bias
        q = self._project(x_btd, "q_proj", self.q_bias if bias else None, cfg.num_heads)
        k = self._project(x_btd, "k_proj", self.k_bias if bias else None, cfg.num_kv_heads)
        v = self._project(x_btd, "v_proj", self.v_bias if bias else None, cfg.num_kv_heads)
        if cfg.qk_norm:
            q = rms_norm(q, self.q_norm[...], cfg.rms_norm_eps)  # (B, T, N, H)
            k = rms_norm(k, self.k_norm[...], cfg.rms_norm_eps)  # (B, T, K, H)
        return apply_rope(q, cos_bth, sin_bth), apply_rope(k, cos_bth, sin_bth), v

    def output(self, attn_btnh):
        b, t = attn_btnh.shape[:2]
        flat = attn_btnh.reshape(b, t, -1)  # (B, T, N*H)
        return _dense(self, "o_proj", flat, self.cfg.jnp_dtype)  # (B, T, D)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). Weights gate/up [F, D], down [D, F]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.jnp_param_dtype
        self.gate_proj = _param(rngs, (f, d), ("mlp", "embed"), pd)
        self.up_proj = _param(rngs, (f, d), ("mlp", "embed"), pd)
        self.down_proj = _param(rngs, (d, f), ("embed", "mlp"), pd)
        self.dtype = cfg.jnp_dtype

    def __call__(self, x_btd):
        dt = self.dtype
        gate = _dense(self, "gate_proj", x_btd, dt)  # (B, T, F)
        up = _dense(self, "up_proj", x_btd, dt)  # (B, T, F)
        return _dense(self, "down_proj", jax.nn.silu(gate) * up, dt)  # (B, T, D)


class Block(nnx.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = cfg.jnp_param_dtype
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x_btd, cos_bth, sin_bth, mask_btt):
        """One layer over T tokens attending to each other under mask_btt [B, T, T]."""
        q, k, v = self.attn.qkv(self.input_norm(x_btd), cos_bth, sin_bth)
        return self._finish(x_btd, causal_attend(q, k, v, mask_btt))

    def cached(self, x_btd, cos_bth, sin_bth, old_mask_bts, new_mask_btt, keys_bkhs,
               values_bksh, cache_index, prefixes: bool):
        """One layer over T new tokens against this layer's cache, which it only reads.

        keys [B, K, H, S], values [B, K, S, H]: the cache, holding the earlier tokens at
        slots < cache_index; the new tokens attend to their own keys and values directly
        (`cached_attention`, masks as there), so the caller writes them into the cache once
        for all layers after the last one (or not at all). Returns (x [B, T, D], the new
        tokens' (keys, values) [B, T, K, H]).
        """
        q, k, v = self.attn.qkv(self.input_norm(x_btd), cos_bth, sin_bth)
        attn = cached_attention(q, k, v, keys_bkhs, values_bksh, old_mask_bts, new_mask_btt,
                                cache_index, prefixes)
        return self._finish(x_btd, attn), (k, v)

    def _finish(self, x_btd, attn_btnh):
        x_btd = x_btd + self.attn.output(attn_btnh)
        return x_btd + self.mlp(self.post_attn_norm(x_btd))


def _run_block(graphdef, block_state, x, cos, sin, mask):
    return nnx.merge(graphdef, block_state)(x, cos, sin, mask)


# ----------------------------------------------------------------------------- KV cache


class KVCache(NamedTuple):
    """Keys and values of every layer: k [L, B, K, H, S], v [L, B, K, S, H].

    Keys are stored with the slots last and values with the head dims last: both
    attention matmuls then run along contiguous memory and read the cache as it is
    stored (with keys [.., S, H] a decode step's score matmul took ~40% of its time on
    CPU). All rows of a call write the same slots (`cache_index`), so a batch with rows
    of unequal lengths has masked holes; RoPE positions count real tokens only.
    """

    k: jax.Array
    v: jax.Array

    def write(self, start, k_lbtkh, v_lbtkh) -> KVCache:
        """The cache with slots [start, start + T) of every layer set to k, v [L, B, T, K, H]
        (in place where the buffers can be donated or are a loop's carry)."""
        zero = jnp.zeros((), jnp.int32)
        start = jnp.asarray(start, jnp.int32)
        k_new = k_lbtkh.transpose(0, 1, 3, 4, 2).astype(self.k.dtype)  # (L, B, K, H, T)
        v_new = v_lbtkh.transpose(0, 1, 3, 2, 4).astype(self.v.dtype)  # (L, B, K, T, H)
        k = jax.lax.dynamic_update_slice(self.k, k_new, (zero, zero, zero, zero, start))
        v = jax.lax.dynamic_update_slice(self.v, v_new, (zero, zero, zero, start, zero))
        return KVCache(k, v)

    def prefix(self, n: int) -> KVCache:
        """The first n slots of every layer."""
        return KVCache(self.k[..., :n], self.v[..., :n, :])

    def with_prefix(self, head: KVCache) -> KVCache:
        """This cache with its first slots replaced by `head` (a `prefix` of it)."""
        zeros = (0,) * self.k.ndim
        return KVCache(jax.lax.dynamic_update_slice(self.k, head.k, zeros),
                       jax.lax.dynamic_update_slice(self.v, head.v, zeros))


# Logical axes of the cache buffers (sharding rules and the memory plan).
KEY_AXES = ("layers", "batch", "kv_heads", "head_dim", "length")
VALUE_AXES = ("layers", "batch", "kv_heads", "length", "head_dim")
# A decode step reads the smallest of up to 4 prefixes of the cache (S, S/2, S/4, S/8,
# none under 128 slots) that holds the filled slots; a prefill or a tree of commands (many
# new tokens, whose attention costs far more per slot read) the smallest of the multiples
# of S/8 (none under 128 slots) that does.
ATTENTION_PREFIXES, MIN_ATTENTION_PREFIX = 4, 128
PREFILL_PREFIX_STEPS = 8


def prefix_sizes(slots: int) -> list[int]:
    """The cache prefixes a decode step may be cut to, smallest first: slots, slots / 2, ...
    down to `MIN_ATTENTION_PREFIX`, at most `ATTENTION_PREFIXES` of them."""
    sizes = [slots]
    while (len(sizes) < ATTENTION_PREFIXES and sizes[-1] % 2 == 0
           and sizes[-1] // 2 >= MIN_ATTENTION_PREFIX):
        sizes.append(sizes[-1] // 2)
    return sizes[::-1]


def prefill_prefix_sizes(slots: int) -> list[int]:
    """The cache prefixes the attention of several new tokens may be cut to, smallest
    first: the multiples of slots / `PREFILL_PREFIX_STEPS` (at least `MIN_ATTENTION_PREFIX`
    slots) below slots, then slots."""
    step = max(-(-slots // PREFILL_PREFIX_STEPS), MIN_ATTENTION_PREFIX)
    return list(range(step, slots, step)) + [slots]


def cached_attention(q_btnh, k_btkh, v_btkh, keys_bkhs, values_bksh, old_mask_bts,
                     new_mask_btt, cache_index, prefixes: bool = True):
    """Grouped-query attention of T new tokens over one layer's cache and themselves.

    q [B, T, N, H]; k, v [B, T, K, H]: the new tokens' (they follow slot cache_index - 1);
    keys [B, K, H, S], values [B, K, S, H]: the cache as it is stored, read at slots
    < cache_index only (later slots may hold stale data); old_mask_bts [B, T or 1, S]:
    True where query t may see cache slot s (slots >= cache_index are never seen);
    new_mask_btt [B, T, T]: True where query t may see new token t' (causal for a prefill,
    a tree's ancestors when scoring commands). With `prefixes`, the cache is read over the
    smallest of `prefix_sizes(S)` (one new token) or `prefill_prefix_sizes(S)` (several)
    that holds cache_index slots (one compiled branch per size, chosen by `lax.switch`), so
    a call early in a long cache does not pay for the empty rest. On CPU several new
    tokens attend one batch row at a time (`_row_by_row`). Scores and softmax in float32.
    Returns [B, T, N, H].
    """
    t, s = q_btnh.shape[1], old_mask_bts.shape[2]
    cache_index = jnp.asarray(cache_index, jnp.int32)
    new_mask = new_mask_btt
    old_mask = old_mask_bts & (jnp.arange(s) < cache_index)

    two_part = _two_part_attention
    if t > 1 and jax.default_backend() == "cpu":
        two_part = _row_by_row(_two_part_attention)

    def attend_over(n):
        return lambda old_mask: two_part(
            q_btnh, k_btkh, v_btkh, keys_bkhs[..., :n], values_bksh[:, :, :n],
            old_mask[..., :n], new_mask)

    if not prefixes:
        sizes = [s]
    else:
        sizes = prefill_prefix_sizes(s) if t > 1 else prefix_sizes(s)
    if len(sizes) == 1:
        return attend_over(s)(old_mask)
    branch = sum((cache_index > n).astype(jnp.int32) for n in sizes[:-1])
    return jax.lax.switch(branch, [attend_over(n) for n in sizes], old_mask)


def _row_by_row(attention):
    """`attention` run on one batch row at a time (`lax.map`), same arguments and result.

    On XLA:CPU a prefill's attention over a long cache is bound by the passes over its
    float32 scores (mask, max, exp, sum): [B, K, G, T, S] is 600 MB at B = 32, T = 256,
    S = 2048, while one row's 19 MB stays in the L3 cache between passes. One layer's
    attention there took 0.50 s row by row against 0.94 s batched (docs/real_model.md,
    "Prefill attention row by row"). Every argument has the batch axis first.
    """
    def one_row(args):
        return attention(*(x[None] for x in args))[0]

    return lambda *args: jax.lax.map(one_row, args)


def _two_part_attention(q_btnh, k_btkh, v_btkh, keys_bkhs, values_bksh, old_mask_bts,
                        new_mask_btt):
    """softmax over [cache slots, new tokens] of q's scores, times their values: the cache
    part read as stored, the new part from the new tokens' own keys and values."""
    b, t, n, h = q_btnh.shape
    k = keys_bkhs.shape[1]
    g = n // k
    q = q_btnh.reshape(b, t, k, g, h).transpose(0, 2, 3, 1, 4)  # (B, K, G, T, H)
    if t == 1:  # a decode step: a product-and-sum reads the cache where it is stored
        old = jnp.sum(q.astype(jnp.float32)[..., 0, :, None] * keys_bkhs[:, :, None],
                      axis=-2)[:, :, :, None]  # (B, K, G, 1, S)
    else:
        old = jnp.einsum("bkgth,bkhs->bkgts", q, keys_bkhs, preferred_element_type=jnp.float32)
    new = jnp.einsum("bkgth,bjkh->bkgtj", q, k_btkh, preferred_element_type=jnp.float32)
    scale = h ** -0.5
    old = jnp.where(old_mask_bts[:, None, None], old * scale, _MASKED)
    new = jnp.where(new_mask_btt[:, None, None], new * scale, _MASKED)
    top = jnp.maximum(old.max(axis=-1, keepdims=True), new.max(axis=-1, keepdims=True))
    p_old, p_new = jnp.exp(old - top), jnp.exp(new - top)
    total = p_old.sum(axis=-1) + p_new.sum(axis=-1)  # (B, K, G, T)
    if t == 1:
        out = jnp.sum(p_old[:, :, :, 0, :, None] * values_bksh[:, :, None].astype(jnp.float32),
                      axis=-2)[:, :, :, None]  # (B, K, G, 1, H)
    else:
        out = jnp.einsum("bkgts,bksh->bkgth", p_old.astype(values_bksh.dtype), values_bksh,
                         preferred_element_type=jnp.float32)
    out = out + jnp.einsum("bkgtj,bjkh->bkgth", p_new.astype(v_btkh.dtype), v_btkh,
                           preferred_element_type=jnp.float32)
    out = out / total[..., None]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h).astype(q_btnh.dtype)


# ----------------------------------------------------------------------------- model


class Transformer(nnx.Module):
    """The decoder: `model(input_ids) -> logits`, `hidden_states` + `logits` for the
    learner, and `forward_with_cache` for the sampler (prefill and decode).

    With `scan_layers` the layers live stacked in `self.blocks` (leading axis
    `layers`, size L) and run under `lax.scan`, so compile time does not grow with depth;
    otherwise in `self.layers` (an `nnx.List`), unrolled. With `remat` each layer is
    recomputed in the backward pass, keeping what REMAT_POLICIES says.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        cfg = config
        pd = cfg.jnp_param_dtype
        self.config = cfg
        self.embed_tokens = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
        if cfg.scan_layers:
            self.blocks = _stacked_blocks(cfg, rngs)
        else:
            self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
        if not cfg.tie_embeddings:
            self.lm_head = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)

    # -- public API

    def __call__(self, input_ids, positions=None, attention_mask=None):
        """input_ids int32 [B, T] -> float32 logits [B, T, V].

        attention_mask [B, T] (1 = real token, 0 = padding; default all ones).
        positions [B, T] (default: the count of real tokens before each one, so
        left- and right-padded rows give the same logits on their real tokens).
        """
        return self.logits(self.hidden_states(input_ids, positions, attention_mask))

    def hidden_states(self, input_ids, positions=None, attention_mask=None):
        """Final-norm hidden states [B, T, D] in the activation dtype."""
        return self.upper_hidden(self.lower_hidden(input_ids, positions, attention_mask, 0),
                                 positions, attention_mask, 0)

    def lower_hidden(self, input_ids, positions=None, attention_mask=None, n: int = 0):
        """The residual stream [B, T, D] after the embedding and the first n layers (no
        final norm): the input `upper_hidden` continues from. With the first n layers frozen
        it is fixed for a batch, so a learner computes it once per batch."""
        positions, attention_mask = _defaults(input_ids, positions, attention_mask)
        x = self._embed(input_ids, positions)[0]  # (B, T, D)
        return self._layers(x, positions, attention_mask, 0, n)

    def upper_hidden(self, x_btd, positions=None, attention_mask=None, n: int = 0):
        """Layers n..L-1 and the final norm over the residual stream `lower_hidden(.., n)`
        returned: [B, T, D] -> final-norm hidden states [B, T, D]."""
        positions, attention_mask = _defaults(x_btd[..., 0], positions, attention_mask)
        return self.final_norm(self._layers(x_btd, positions, attention_mask, n,
                                            self.config.num_layers))

    def logits(self, hidden_btd):
        """Output projection [..., D] -> float32 [..., V] (tied: the embedding)."""
        table = self.embed_tokens if self.config.tie_embeddings else self.lm_head
        w = table[...].astype(hidden_btd.dtype)
        return matmul_wt(hidden_btd, w, preferred_element_type=jnp.float32)

    def logits_at(self, hidden_btd, ids_btk):
        """The output projection's logits of the ids only: [B, T, D], [B, T, K] int32 ->
        float32 [B, T, K] (`logits(hidden)` gathered at `ids`, without the [B, T, V])."""
        table = self.embed_tokens if self.config.tie_embeddings else self.lm_head
        w = table[...][ids_btk].astype(hidden_btd.dtype)  # (B, T, K, D)
        return jnp.einsum("btd,btkd->btk", hidden_btd, w, preferred_element_type=jnp.float32)

    def init_cache(self, batch: int, slots: int, dtype=None) -> KVCache:
        """Zeroed cache: k [L, batch, K, H, slots], v [L, batch, K, slots, H] in `dtype`
        (default: the activation dtype)."""
        cfg = self.config
        dtype = cfg.jnp_dtype if dtype is None else dtype
        keys = (cfg.num_layers, batch, cfg.num_kv_heads, cfg.head_dim, slots)
        values = (cfg.num_layers, batch, cfg.num_kv_heads, slots, cfg.head_dim)
        return KVCache(jnp.zeros(keys, dtype), jnp.zeros(values, dtype))

    def forward_with_cache(self, input_ids, positions, cache: KVCache, cache_index,
                           cache_mask, *, prefixes: bool = True, last_only: bool = True,
                           new_mask=None, write: bool = True, capture: int = 0):
        """Prefill (T > 1) or decode (T = 1) against a KV cache.

        input_ids [B, T] int32, positions [B, T] (RoPE positions of the new tokens),
        cache: `KVCache` of S slots, cache_index: int scalar, the slot where the first new
        token is written (all rows write the same slots [cache_index, cache_index + T)),
        cache_mask [B, S] bool: which slots hold real tokens *after* this write (the caller
        sets the new slots of real tokens). Query t sees slot s when cache_mask[b, s] and
        s <= cache_index + t. `prefixes`: attention reads only the filled prefix of the
        cache (`cached_attention`; a decode loop that already works on a prefix passes
        False). `new_mask` [B, T, T]: which new tokens each new token sees, instead of the
        causal order of the real ones (e.g. a tree of commands scored at once, each token
        seeing its ancestors); `write=False` leaves the cache as it is (the new tokens then
        need no room in it). Returns (float32 logits, cache): logits [B, V] of the last
        position when `last_only` (rows are left-padded, so it is every row's newest
        token), else [B, T, V]; with `last_only=None`, the final hidden states [B, T, D].
        With `capture` n > 0 it returns (logits, cache, the new tokens' residual stream after
        the first n layers [B, T, D]): what `lower_hidden(.., n)` gives them in their
        context, so a learner with n frozen layers need not run them again.
        """
        b, t = input_ids.shape
        cache_mask = cache_mask.astype(bool)
        old_mask = cache_mask[:, None, :]  # (B, 1, S): every earlier slot that holds a token
        if new_mask is None:
            zero = jnp.zeros((), jnp.int32)
            real = jax.lax.dynamic_slice(cache_mask, (zero, jnp.asarray(cache_index, jnp.int32)),
                                         (b, t))  # (B, T)
            new_mask = jnp.tril(jnp.ones((t, t), bool))[None] & real[:, None, :]
        x, cos, sin = self._embed(input_ids, positions)

        def one_layer(x, graphdef, state, keys, values):
            block = nnx.merge(graphdef, state)
            return block.cached(x, cos, sin, old_mask, new_mask, keys, values, cache_index,
                                prefixes)

        # The cache is only read inside the layer loop and written once after it: a
        # buffer written and read in the same loop would be copied whole at every layer.
        # The residual stream after the first `capture` layers (a placeholder without).
        kept = x if capture else jnp.zeros((0,), x.dtype)
        if self.config.scan_layers:
            graphdef, state = nnx.split(self.blocks)

            def scanned(carry, xs):
                x, kept = carry
                layer, *weights_and_cache = xs
                x, kv = one_layer(x, graphdef, *weights_and_cache)
                if capture:  # a select of [B, T, D] a layer: little beside the layer
                    kept = jnp.where(layer == capture - 1, x, kept)
                return (x, kept), kv

            layers = jnp.arange(self.config.num_layers)
            (x, kept), (k_new, v_new) = jax.lax.scan(
                scanned, (x, kept), (layers, state, cache.k, cache.v))
        else:
            new = []
            for layer, block in enumerate(self.layers):
                x, kv = one_layer(x, *nnx.split(block), cache.k[layer], cache.v[layer])
                new.append(kv)
                if layer == capture - 1:
                    kept = x
            k_new, v_new = (jnp.stack(parts) for parts in zip(*new))
        if write:
            cache = cache.write(cache_index, k_new, v_new)
        if last_only is None:
            out = self.final_norm(x)
        else:
            out = self.logits(self.final_norm(x[:, -1] if last_only else x))
        return (out, cache, kept) if capture else (out, cache)

    # -- internals

    def _embed(self, input_ids, positions):
        """Token embeddings [B, T, D] and the RoPE tables [B, T, H] of the positions."""
        cfg = self.config
        x = self.embed_tokens[...][input_ids].astype(cfg.jnp_dtype)  # (B, T, D)
        cos, sin = rope_tables(positions, cfg)
        return x, cos, sin

    def _layers(self, x_btd, positions, attention_mask, start: int, stop: int):
        """Layers start..stop-1 over x [B, T, D] (full causal self-attention)."""
        if start >= stop:
            return x_btd
        mask = causal_padding_mask(attention_mask)
        cos, sin = rope_tables(positions, self.config)
        run = _remat(_run_block, self.config.remat)
        if self.config.scan_layers:
            graphdef, state = nnx.split(self.blocks)
            if (start, stop) != (0, self.config.num_layers):
                state = jax.tree.map(lambda a: a[start:stop], state)
            x_btd, _ = jax.lax.scan(
                lambda x, s: (run(graphdef, s, x, cos, sin, mask), None), x_btd, state)
        else:
            for block in self.layers[start:stop]:
                graphdef, state = nnx.split(block)
                x_btd = run(graphdef, state, x_btd, cos, sin, mask)
        return x_btd


def _defaults(ids_bt, positions, attention_mask):
    """(positions, attention_mask) with the defaults of `Transformer.__call__` filled in."""
    if attention_mask is None:
        attention_mask = jnp.ones(ids_bt.shape, dtype=bool)
    if positions is None:
        positions = default_positions(attention_mask)
    return positions, attention_mask


# model.remat -> what a layer keeps for the backward pass; the rest is recomputed.
REMAT_POLICIES = {
    # only the layer's inputs
    "full": jax.checkpoint_policies.nothing_saveable,
    # also the outputs of matmuls against weights (q/k/v/o projections, MLP); attention
    # scores and probabilities (batched dots, [B, K, G, T, S]) are recomputed
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _remat(fn, mode: str):
    """fn unchanged ("none"), or under jax.checkpoint with REMAT_POLICIES[mode]."""
    if mode == "none":
        return fn
    return jax.checkpoint(fn, static_argnums=(0,), policy=REMAT_POLICIES[mode])


def _stacked_blocks(cfg: ModelConfig, rngs: nnx.Rngs) -> Block:
    """L blocks with every parameter stacked on a leading `layers` axis."""

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make(rngs):
        return Block(cfg, rngs=rngs)

    return make(rngs)


def key_name(key) -> str:
    """The name of one step of a pytree path (a dict key, attribute or index)."""
    return str(getattr(key, "key", getattr(key, "name", key)))


def lower_part(path, n: int) -> slice | None:
    """The part of the parameter at pytree `path` (in a Transformer, or a module holding one)
    that `lower_hidden(.., n)` reads: slice(None) for all of it (the token embedding, an
    unrolled layer below n), slice(0, n) for the first n rows of a stacked layer
    parameter ([L, ...]), None for none (layers n and up, the final norm, an untied output
    layer, anything outside a Transformer)."""
    if not n:
        return None
    names = [key_name(k) for k in path]
    if "embed_tokens" in names:
        return slice(None)
    if "blocks" in names:  # stacked layers: [L, ...]
        return slice(0, n)
    if "layers" in names and int(names[names.index("layers") + 1]) < n:
        return slice(None)
    return None


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
