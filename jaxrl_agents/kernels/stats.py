"""Masked reductions shared by the kernels. `mask` is 1.0 where a value counts."""

import jax.numpy as jnp


def masked_sum(x, mask, axis=None):
    return jnp.sum(x * mask, axis=axis)


def masked_mean(x, mask, axis=None):
    """Mean of `x` over positions where mask == 1; 0 where nothing is masked in."""
    return masked_sum(x, mask, axis) / jnp.maximum(jnp.sum(mask, axis=axis), 1.0)


def masked_var(x, mask, axis=None, *, unbiased=False):
    """Variance of `x` over masked-in positions (population by default)."""
    mean = masked_mean(x, mask, axis=axis)
    mean = mean if axis is None else jnp.expand_dims(mean, axis)
    count = jnp.sum(mask, axis=axis)
    denom = jnp.maximum(count - 1.0, 1.0) if unbiased else jnp.maximum(count, 1.0)
    return masked_sum(jnp.square(x - mean), mask, axis) / denom


def masked_whiten(x, mask, *, shift_mean=True, eps=1e-8):
    """(x - mean) / std over masked-in positions; masked-out positions come back as 0."""
    mean = masked_mean(x, mask)
    std = jnp.sqrt(masked_var(x, mask) + eps)
    centred = x - mean if shift_mean else x
    return centred / std * mask
