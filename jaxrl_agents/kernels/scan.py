"""Linear recurrences over the time axis of [B, T] arrays, as one `lax.scan`.

Every recursion of RL credit assignment has the form

    x[t] = a[t] * x[t+1] + b[t],  x[T] = init        (backward: GAE, returns)
    x[t] = a[t] * x[t-1] + b[t],  x[-1] = init       (forward)

The scan runs time-major ([T, B] slices of B elements per step) inside one compiled
loop. On CPU this measured about 6x faster than `jax.lax.associative_scan`, whose
strided slicing costs more than the log-depth saves at these sizes (bench/gae.py).
"""

import jax
import jax.numpy as jnp


def _affine_scan(a, b, init, reverse):
    init = jnp.zeros(a.shape[:1], b.dtype) if init is None else init.astype(b.dtype)

    def step(x_prev, ab):
        a_t, b_t = ab
        x = a_t * x_prev + b_t
        return x, x

    _, x = jax.lax.scan(step, init, (a.T, b.T), reverse=reverse)
    return x.T


def reverse_linear_recurrence(a, b, init=None):
    """x[t] = a[t] * x[t+1] + b[t] along axis 1, with x[T] = init.

    Args:
      a, b: [B, T] coefficients.
      init: [B] value after the last position (0 when None).
    Returns:
      x: [B, T].
    """
    return _affine_scan(a, b, init, reverse=True)


def forward_linear_recurrence(a, b, init=None):
    """x[t] = a[t] * x[t-1] + b[t] along axis 1, with x[-1] = init.  Shapes as above."""
    return _affine_scan(a, b, init, reverse=False)


def fill_backward(x, mask):
    """Every t takes `x` at the first masked-in position s >= t (0 if none).  [B, T]."""
    return reverse_linear_recurrence(1.0 - mask, mask * x)


def fill_forward(x, mask):
    """Every t takes `x` at the last masked-in position s <= t (0 if none).  [B, T]."""
    return forward_linear_recurrence(1.0 - mask, mask * x)
