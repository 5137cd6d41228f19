"""One Flax NNX decoder for the Qwen2 / Qwen2.5 and Llama families.

Token embedding, RoPE, RMSNorm, grouped-query attention (optional q/k/v bias),
SwiGLU MLP, tied or untied output embedding. Weights keep the Hugging Face
orientation (`[out_features, in_features]`) so checkpoints load without
transposes, and every parameter carries logical axis names (`out_sharding`
metadata) that `jaxrl_agents.sharding` maps onto the mesh.

Shape letters: B batch, T query length, S key length (T, or the cache length),
D hidden size, V vocab, N query heads, K kv heads, G = N // K, H head dim,
F MLP size, L layers.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

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


# ----------------------------------------------------------------------------- maths


def rms_norm(x_btd, scale_d, eps):
    """x / sqrt(mean(x^2) + eps) * scale, computed in float32, returned in x's dtype."""
    x32 = x_btd.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (scale_d.astype(jnp.float32) * x32).astype(x_btd.dtype)


def rope_tables(positions_bt, head_dim, theta):
    """cos and sin tables [B, T, H] for rotate-half RoPE (the Hugging Face layout)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
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

    Returns [B, T, N, H]. Scores and softmax are float32. The softmax is normalised after
    the value matmul, on [B, T, N, H] instead of the [B, N, T, S] weights: the same result
    with S / H times fewer divisions (in both passes).
    """
    b, t, n, h = q_btnh.shape
    k = k_bskh.shape[2]
    q = q_btnh.reshape(b, t, k, n // k, h)  # (B, T, K, G, H)
    scores = jnp.einsum("btkgh,bskh->bkgts", q, k_bskh, preferred_element_type=jnp.float32)
    scores = jnp.where(mask_bts[:, None, None, :, :], scores * (h ** -0.5), _MASKED)
    top = jax.lax.stop_gradient(scores.max(axis=-1, keepdims=True))
    weights = jnp.exp(scores - top)  # (B, K, G, T, S), unnormalised
    total = weights.sum(axis=-1)  # (B, K, G, T)
    out = jnp.einsum("bkgts,bskh->btkgh", weights.astype(v_bskh.dtype), v_bskh,
                     preferred_element_type=jnp.float32)  # (B, T, K, G, H)
    out = out / total.transpose(0, 3, 1, 2)[..., None]
    return out.astype(v_bskh.dtype).reshape(b, t, n, h)


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
    """GQA self-attention. Weights: q [N*H, D], k/v [K*H, D], o [D, N*H]."""

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
        self.cfg = cfg

    def _project(self, x_btd, weight, bias, heads):
        dt = self.cfg.jnp_dtype
        y = jnp.einsum("btd,fd->btf", x_btd, weight[...].astype(dt))
        if bias is not None:
            y = y + bias[...].astype(dt)
        return y.reshape(*y.shape[:2], heads, self.cfg.head_dim)  # (B, T, heads, H)

    def qkv(self, x_btd, cos_bth, sin_bth):
        """Rotated queries [B, T, N, H] and keys, values [B, T, K, H]."""
        cfg = self.cfg
        bias = cfg.qkv_bias
        q = self._project(x_btd, self.q_proj, self.q_bias if bias else None, cfg.num_heads)
        k = self._project(x_btd, self.k_proj, self.k_bias if bias else None, cfg.num_kv_heads)
        v = self._project(x_btd, self.v_proj, self.v_bias if bias else None, cfg.num_kv_heads)
        return apply_rope(q, cos_bth, sin_bth), apply_rope(k, cos_bth, sin_bth), v

    def output(self, attn_btnh):
        b, t = attn_btnh.shape[:2]
        flat = attn_btnh.reshape(b, t, -1)  # (B, T, N*H)
        return jnp.einsum("btf,df->btd", flat, self.o_proj[...].astype(self.cfg.jnp_dtype))


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
        gate = jnp.einsum("btd,fd->btf", x_btd, self.gate_proj[...].astype(dt))
        up = jnp.einsum("btd,fd->btf", x_btd, self.up_proj[...].astype(dt))
        return jnp.einsum("btf,df->btd", jax.nn.silu(gate) * up, self.down_proj[...].astype(dt))


class Block(nnx.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = cfg.jnp_param_dtype
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x_btd, cos_bth, sin_bth, mask_bts, kv=None, cache_index=None):
        """One layer. Without `kv`, attends over its own T keys and returns (x, None).

        With `kv = (k_cache, v_cache)` [B, S, K, H], writes this call's keys and
        values at slots [cache_index, cache_index + T), attends over all S slots
        (mask_bts is [B, T, S]) and returns (x, (k_cache, v_cache)).
        """
        q, k, v = self.attn.qkv(self.input_norm(x_btd), cos_bth, sin_bth)
        if kv is not None:
            k_cache, v_cache = kv
            start = (0, cache_index, 0, 0)
            k = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), start)
            v = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), start)
            kv = (k, v)
            attn = attend(q, k, v, mask_bts)
        else:  # self-attention under a causal mask
            attn = causal_attend(q, k, v, mask_bts)
        x_btd = x_btd + self.attn.output(attn)
        x_btd = x_btd + self.mlp(self.post_attn_norm(x_btd))
        return x_btd, kv


class KVCache(NamedTuple):
    """Keys and values of every layer: k, v [L, B, S, K, H] (S = max cache length)."""

    k: jax.Array
    v: jax.Array


def _run_block(graphdef, block_state, x, cos, sin, mask, kv, cache_index):
    return nnx.merge(graphdef, block_state)(x, cos, sin, mask, kv, cache_index)


# ----------------------------------------------------------------------------- model


class Transformer(nnx.Module):
    """The decoder. `model(input_ids) -> logits`; see `__call__` and `forward_with_cache`.

    With `scan_layers` the layers live stacked in `self.blocks` (leading axis
    `layers`, size L) and run under `lax.scan`; otherwise in `self.layers`
    (an `nnx.List`). With `remat` each layer is recomputed in the backward pass, keeping
    what REMAT_POLICIES says.
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
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, dtype=bool)
        if positions is None:
            positions = default_positions(attention_mask)
        mask = causal_padding_mask(attention_mask)
        x, _ = self._trunk(input_ids, positions, mask, None, None)
        return self.final_norm(x)

    def logits(self, hidden_btd):
        """Output projection [B, T, D] -> float32 [B, T, V] (tied: the embedding)."""
        table = self.embed_tokens if self.config.tie_embeddings else self.lm_head
        w = table[...].astype(hidden_btd.dtype)
        return jnp.einsum("btd,vd->btv", hidden_btd, w, preferred_element_type=jnp.float32)

    def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        """Zeroed cache: k, v [L, batch, max_len, K, H] in `dtype` (default: activations)."""
        cfg = self.config
        shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
        dtype = cfg.jnp_dtype if dtype is None else dtype
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def forward_with_cache(self, input_ids, positions, cache: KVCache, cache_index,
                           cache_mask):
        """Prefill (T > 1) or decode (T = 1) step against a KV cache.

        input_ids [B, T] int32, positions [B, T] (RoPE positions of the new tokens),
        cache: KVCache with k, v [L, B, S, K, H], cache_index: int scalar, the slot
        where the first new token is written (all rows write the same slots
        [cache_index, cache_index + T)), cache_mask [B, S] bool: which slots hold
        real tokens *after* this write (the caller sets the new slots of real tokens).
        Query t sees slot s when cache_mask[b, s] and s <= cache_index + t.
        Returns (float32 logits [B, T, V], updated KVCache).
        """
        t = input_ids.shape[1]
        s = cache.k.shape[2]
        query_slot = cache_index + jnp.arange(t)  # (T,)
        causal = jnp.arange(s)[None, :] <= query_slot[:, None]  # (T, S)
        mask = causal[None] & cache_mask[:, None, :].astype(bool)  # (B, T, S)
        x, cache = self._trunk(input_ids, positions, mask, cache, cache_index)
        return self.logits(self.final_norm(x)), cache

    # -- internals

    def _trunk(self, input_ids, positions, mask, cache, cache_index):
        """Embedding and all layers; returns (x [B, T, D] before the final norm, cache)."""
        cfg = self.config
        x = self.embed_tokens[...][input_ids].astype(cfg.jnp_dtype)  # (B, T, D)
        cos, sin = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
        run = _remat(_run_block, cfg.remat)
        if cfg.scan_layers:
            return self._scan_layers(run, x, cos, sin, mask, cache, cache_index)
        new_k, new_v = [], []
        for i, block in enumerate(self.layers):
            graphdef, state = nnx.split(block)
            kv = None if cache is None else (cache.k[i], cache.v[i])
            x, kv = run(graphdef, state, x, cos, sin, mask, kv, cache_index)
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        if cache is not None:
            cache = KVCache(jnp.stack(new_k), jnp.stack(new_v))
        return x, cache

    def _scan_layers(self, run, x, cos, sin, mask, cache, cache_index):
        graphdef, state = nnx.split(self.blocks)

        def body(x, layer):
            block_state, kv = layer
            x, kv = run(graphdef, block_state, x, cos, sin, mask, kv, cache_index)
            return x, kv

        kv_stack = None if cache is None else (cache.k, cache.v)
        x, kv_stack = jax.lax.scan(body, x, (state, kv_stack))
        return x, (None if cache is None else KVCache(*kv_stack))


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


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
