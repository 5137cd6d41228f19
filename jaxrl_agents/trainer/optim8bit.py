"""8-bit Adam: Adam whose two moments are stored block-wise quantised.

Each moment leaf is flattened, zero-padded to a multiple of `block_size` and cut into
blocks [num_blocks, block_size]; every block has its own scale, so one large entry only
coarsens the 255 others of its block (the bitsandbytes 8-bit Adam layout).

First moment m (signed): int8 codes c in [-127, 127] against the block's absmax s, with
square-root companding:

    c = round(127 * sign(m) * sqrt(|m| / s)),    m ~ s * sign(c) * (c / 127)^2.

The round-trip error is under s / 127 everywhere and much finer near 0 (the smallest
non-zero level is s / 127^2). Linear int8 (m ~ s * c / 127) rounds entries under s / 254
to 0: an entry whose gradient is some 25x smaller than its block's largest momentum
never gathers momentum at all, since (1 - b1) * g rounds away every step.

Second moment v (non-negative): uint8 codes on a log scale between the block's smallest
(lo) and largest (hi) positive log value; code 0 is exactly 0:

    log v ~ lo + (c - 1) * (hi - lo) / 254,   c = 1..255.

The relative error of v stays under exp((hi - lo) / 508) - 1 whatever the block holds.
Adam divides by sqrt(v), so relative accuracy is what it needs: a linear code that
rounded a small v to 0 would turn its update into m / eps.

The update itself is computed from the float32 moments before they are re-quantised, as
bitsandbytes does. State per parameter: 2 bytes plus 12 bytes per block (about 2.05
bytes at block_size 256, against 8 for float32 Adam).

On a mesh the blocks are split over ('data', 'fsdp') (logical axis `moment_blocks` in
`sharding.LOGICAL_AXIS_RULES`), ZeRO style, so the state per device shrinks with both.
A leaf whose number of blocks that split does not divide stays replicated; no blocks are
padded in, so only small leaves (norm scales, biases: a few blocks) are replicated, e.g.
every Qwen2.5 weight matrix has a multiple of 64 blocks.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

BLOCK_SIZE = 256
_SIGNED_MAX = 127  # int8 codes of the first moment: [-127, 127]
_LOG_LEVELS = 254  # uint8 codes 1..255 of the second moment; 0 is exact zero


class SignedBlocks(NamedTuple):
    """A signed float array as int8 codes: codes [num_blocks, block_size], absmax [num_blocks]."""

    codes: jax.Array
    absmax: jax.Array
    logical_axes = (("moment_blocks", None), ("moment_blocks",))  # per child, for sharding


class LogBlocks(NamedTuple):
    """A non-negative float array as uint8 log codes: codes [num_blocks, block_size];
    lo, hi [num_blocks]: the log of the block's smallest and largest positive value."""

    codes: jax.Array
    lo: jax.Array
    hi: jax.Array
    logical_axes = (("moment_blocks", None), ("moment_blocks",), ("moment_blocks",))


def to_blocks(x, block_size: int = BLOCK_SIZE):
    """Any shape -> float32 [ceil(size / block_size), block_size], zero-padded at the end."""
    flat = x.reshape(-1).astype(jnp.float32)
    num_blocks = -(-flat.size // block_size)
    flat = jnp.pad(flat, (0, num_blocks * block_size - flat.size))
    return flat.reshape(num_blocks, block_size)


def from_blocks(blocks, shape):
    """[num_blocks, block_size] -> `shape` (the padding dropped)."""
    size = 1
    for n in shape:
        size *= n
    return blocks.reshape(-1)[:size].reshape(shape)


def quantize_signed(x, block_size: int = BLOCK_SIZE) -> SignedBlocks:
    """Float array (any shape) -> SignedBlocks, square-root companded against the absmax."""
    blocks = to_blocks(x, block_size)  # (nb, bs)
    absmax = jnp.max(jnp.abs(blocks), axis=1)  # (nb,)
    scale = jnp.where(absmax > 0, absmax, 1.0)[:, None]
    level = jnp.sqrt(jnp.abs(blocks) / scale) * _SIGNED_MAX
    codes = jnp.sign(blocks) * jnp.clip(jnp.round(level), 0, _SIGNED_MAX)
    return SignedBlocks(codes.astype(jnp.int8), absmax)


def dequantize_signed(q: SignedBlocks, shape):
    """SignedBlocks -> float32 array of `shape`: absmax * sign(c) * (c / 127)^2."""
    c = q.codes.astype(jnp.float32) / _SIGNED_MAX
    return from_blocks(q.absmax[:, None] * jnp.sign(c) * c * c, shape)


def quantize_log(x, block_size: int = BLOCK_SIZE) -> LogBlocks:
    """Non-negative float array (any shape) -> LogBlocks (log-spaced codes per block)."""
    blocks = to_blocks(x, block_size)  # (nb, bs)
    positive = blocks > 0
    logs = jnp.log(jnp.where(positive, blocks, 1.0))
    lo = jnp.min(jnp.where(positive, logs, jnp.inf), axis=1)  # (nb,)
    hi = jnp.max(jnp.where(positive, logs, -jnp.inf), axis=1)
    any_positive = jnp.any(positive, axis=1)
    lo, hi = jnp.where(any_positive, lo, 0.0), jnp.where(any_positive, hi, 0.0)
    span = jnp.where(hi > lo, hi - lo, 1.0)[:, None]
    level = jnp.clip(jnp.round((logs - lo[:, None]) / span * _LOG_LEVELS), 0, _LOG_LEVELS)
    codes = jnp.where(positive, level + 1, 0)
    return LogBlocks(codes.astype(jnp.uint8), lo, hi)


def dequantize_log(q: LogBlocks, shape):
    """LogBlocks -> float32 array of `shape`: exp(lo + (c - 1) * (hi - lo) / 254), 0 at c = 0."""
    c = q.codes.astype(jnp.float32)
    step = ((q.hi - q.lo) / _LOG_LEVELS)[:, None]
    values = jnp.exp(q.lo[:, None] + (c - 1.0) * step)
    return from_blocks(jnp.where(q.codes > 0, values, 0.0), shape)


class ScaleByAdam8bitState(NamedTuple):
    """count: int32 []; mu, nu: one SignedBlocks / LogBlocks per parameter leaf, in the
    order of jax.tree.leaves(params)."""

    count: jax.Array
    mu: tuple[SignedBlocks, ...]
    nu: tuple[LogBlocks, ...]


def scale_by_adam_8bit(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, block_size: int = BLOCK_SIZE
) -> optax.GradientTransformation:
    """optax.scale_by_adam with 8-bit moments (see the module docstring).

    update = m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t),
    computed in float32 and returned in each gradient's dtype.
    """

    def init_fn(params):
        # All-zero codes and scales: what quantising zero moments gives.
        blocks = [-(-x.size // block_size) for x in jax.tree.leaves(params)]
        zeros = lambda n, dtype: jnp.zeros((n, block_size), dtype)
        scale = lambda n: jnp.zeros((n,), jnp.float32)
        return ScaleByAdam8bitState(
            count=jnp.zeros((), jnp.int32),
            mu=tuple(SignedBlocks(zeros(n, jnp.int8), scale(n)) for n in blocks),
            nu=tuple(LogBlocks(zeros(n, jnp.uint8), scale(n), scale(n)) for n in blocks),
        )

    def update_fn(updates, state, params=None):
        del params
        grads, treedef = jax.tree.flatten(updates)
        count = optax.safe_increment(state.count)
        m_correction = 1.0 - b1 ** count.astype(jnp.float32)
        v_correction = 1.0 - b2 ** count.astype(jnp.float32)
        steps, mu, nu = [], [], []
        for g, m_q, v_q in zip(grads, state.mu, state.nu, strict=True):
            g32 = g.astype(jnp.float32)
            m = b1 * dequantize_signed(m_q, g.shape) + (1.0 - b1) * g32
            v = b2 * dequantize_log(v_q, g.shape) + (1.0 - b2) * g32 * g32
            step = (m / m_correction) / (jnp.sqrt(v / v_correction) + eps)
            steps.append(step.astype(g.dtype))
            mu.append(quantize_signed(m, block_size))
            nu.append(quantize_log(v, block_size))
        return treedef.unflatten(steps), ScaleByAdam8bitState(count, tuple(mu), tuple(nu))

    return optax.GradientTransformation(init_fn, update_fn)


def adam_8bit(
    learning_rate,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    block_size: int = BLOCK_SIZE,
) -> optax.GradientTransformation:
    """optax.adam with 8-bit moments; `learning_rate` is a float or an optax schedule."""
    return optax.chain(
        scale_by_adam_8bit(b1, b2, eps, block_size), optax.scale_by_learning_rate(learning_rate)
    )
