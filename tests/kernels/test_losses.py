import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_agents import kernels
from tests.kernels import references as ref

AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


def _policy_inputs(seed):
    rewards, values, mask, _ = ref.random_batch(seed)
    rng = np.random.default_rng(seed + 100)
    old_logp = -rng.uniform(0.1, 3.0, size=mask.shape).astype(np.float32)
    logp = old_logp + rng.normal(scale=0.3, size=mask.shape).astype(np.float32)
    adv = rng.normal(size=mask.shape).astype(np.float32)
    return logp, old_logp, adv, mask


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize(
    "clip_high, dual_clip", [(None, None), (0.28, None), (None, 3.0), (0.28, 2.0)]
)
def test_ppo_policy_loss_matches_loop(agg, clip_high, dual_clip):
    logp, old_logp, adv, mask = _policy_inputs(0)
    loss, metrics = kernels.ppo_policy_loss(
        logp,
        old_logp,
        adv,
        mask,
        clip_eps=0.2,
        clip_eps_high=clip_high,
        dual_clip=dual_clip,
        agg=agg,
    )
    per_token = ref.ppo_per_token(logp, old_logp, adv, 0.2, clip_high, dual_clip)
    assert float(loss) == pytest.approx(ref.aggregate(per_token, mask, agg), rel=1e-5, abs=1e-6)
    ratio = np.exp(logp - old_logp)
    high = 0.2 if clip_high is None else clip_high
    clipped = (-adv * np.clip(ratio, 0.8, 1 + high)) > (-adv * ratio)
    assert float(metrics["clip_frac"]) == pytest.approx((clipped * mask).sum() / mask.sum())
    assert float(metrics["approx_kl"]) >= 0.0


def test_ppo_ratio_one_gives_minus_mean_advantage():
    _, old_logp, adv, mask = _policy_inputs(1)
    loss, metrics = kernels.ppo_policy_loss(old_logp, old_logp, adv, mask, clip_eps=0.2)
    assert float(loss) == pytest.approx(-(adv * mask).sum() / mask.sum(), rel=1e-5)
    assert float(metrics["clip_frac"]) == 0.0


@pytest.mark.parametrize("clip", [None, 0.2])
@pytest.mark.parametrize("agg", AGGS)
def test_value_loss_matches_loop(clip, agg):
    rewards, values, mask, _ = ref.random_batch(2)
    rng = np.random.default_rng(5)
    old_values = values + rng.normal(scale=0.5, size=values.shape).astype(np.float32)
    loss, metrics = kernels.value_loss(values, old_values, rewards, mask, clip=clip, agg=agg)
    want = ref.aggregate(ref.value_per_token(values, old_values, rewards, clip), mask, agg)
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert "explained_var" in metrics


@pytest.mark.parametrize("agg", AGGS)
def test_entropy_matches_loop(agg):
    _, _, mask, _ = ref.random_batch(3, batch=3, length=7)
    logits = np.random.default_rng(0).normal(scale=2.0, size=(3, 7, 11)).astype(np.float32)
    ent, _ = kernels.entropy(logits, mask, agg=agg)
    want = ref.aggregate(ref.entropy_per_token(logits), mask, agg)
    assert float(ent) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_matches_loop(kind):
    logp, ref_logp, _, mask = _policy_inputs(4)
    got, _ = kernels.kl(logp, ref_logp, mask, kind=kind)
    want = ref.aggregate(ref.kl_per_token(logp, ref_logp, kind), mask, "token-mean")
    assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-7)
    if kind != "k1":
        assert np.all(np.asarray(kernels.kl_per_token(logp, ref_logp, kind)) >= 0)


def test_token_logprobs():
    logits = np.random.default_rng(0).normal(size=(2, 3, 5)).astype(np.float32)
    targets = np.array([[0, 4, 2], [1, 1, 3]])
    got = kernels.token_logprobs(logits, targets)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(
        got, np.take_along_axis(logp, targets[..., None], -1)[..., 0], rtol=1e-5
    )


def test_all_padding_batch_gives_zero_losses():
    mask = np.zeros((2, 4), np.float32)
    x = np.ones((2, 4), np.float32)
    for agg in AGGS:
        loss, _ = kernels.ppo_policy_loss(x, x, x, mask, clip_eps=0.2, agg=agg)
        assert float(loss) == 0.0


def _finite_difference_check(f, x, seed=0, eps=1e-3, rtol=2e-2):
    """Compares jax.grad(f) along a random direction with a central difference."""
    x = jnp.asarray(x, jnp.float32)
    direction = jnp.asarray(np.random.default_rng(seed).normal(size=x.shape), jnp.float32)
    analytic = float(jnp.vdot(jax.grad(f)(x), direction))
    numeric = float((f(x + eps * direction) - f(x - eps * direction)) / (2 * eps))
    assert analytic == pytest.approx(numeric, rel=rtol, abs=1e-4)


@pytest.mark.parametrize("agg", AGGS)
def test_gradients_match_finite_differences(agg):
    logp, old_logp, adv, mask = _policy_inputs(6)
    logp, old_logp, adv, mask = (a[:, :12] for a in (logp, old_logp, adv, mask))
    mask[1, :] = 1.0  # make sure there are action tokens in this small slice

    def policy(lp):
        return kernels.ppo_policy_loss(
            lp, old_logp, adv, mask, clip_eps=0.2, dual_clip=3.0, agg=agg
        )[0]

    _finite_difference_check(policy, logp)
    values, returns = adv * 0.3, adv
    _finite_difference_check(
        lambda v: kernels.value_loss(v, values + 0.05, returns, mask, clip=0.2, agg=agg)[0],
        values,
    )
    logits = np.random.default_rng(1).normal(size=mask.shape + (5,)).astype(np.float32)
    _finite_difference_check(lambda z: kernels.entropy(z, mask, agg=agg)[0], logits)
    for kind in ("k1", "k2", "k3"):
        _finite_difference_check(lambda lp, k=kind: kernels.kl(lp, old_logp, mask, kind=k)[0], logp)


def test_next_token_logprobs_aligns_with_targets():
    logits = np.random.default_rng(2).normal(size=(2, 4, 6)).astype(np.float32)
    ids = np.array([[1, 2, 3, 4], [5, 0, 1, 2]])
    got = np.asarray(kernels.next_token_logprobs(logits, ids))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert got.shape == (2, 4) and np.all(got[:, 0] == 0)
    for b in range(2):
        for t in range(1, 4):
            assert got[b, t] == pytest.approx(logp[b, t - 1, ids[b, t]], rel=1e-5)
    np.testing.assert_array_equal(kernels.shift_right(np.ones((1, 3)))[0], [0, 1, 1])


def _np_log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_next_token_logprobs_and_entropy_match_numpy_with_and_without_restriction():
    rng = np.random.default_rng(0)
    b, t, v, k = 3, 7, 11, 4
    logits = rng.normal(size=(b, t, v)).astype(np.float32) * 2
    ids = rng.integers(0, v, size=(b, t)).astype(np.int32)
    allowed = np.full((b, t, k), -1, np.int32)
    # Restrict a few tokens to random id sets that contain them (one of a single id).
    for (row, col, n) in [(0, 2, 3), (0, 3, 1), (1, 6, 4), (2, 1, 2)]:
        others = [i for i in rng.permutation(v) if i != ids[row, col]][: n - 1]
        allowed[row, col, :n] = sorted([ids[row, col], *others])
    logp, ent = kernels.next_token_logprobs_and_entropy(jnp.asarray(logits), ids, allowed)
    free_logp, free_ent = kernels.next_token_logprobs_and_entropy(jnp.asarray(logits), ids)
    np.testing.assert_allclose(free_logp, kernels.next_token_logprobs(logits, ids), atol=1e-6)
    np.testing.assert_allclose(free_ent, kernels.shift_right(kernels.token_entropy(logits)),
                               atol=1e-5)
    want_logp, want_ent = np.zeros((b, t)), np.zeros((b, t))
    for row in range(b):
        for col in range(1, t):
            ok = allowed[row, col][allowed[row, col] >= 0]
            ids_here = ok if len(ok) else np.arange(v)
            lp = _np_log_softmax(logits[row, col - 1, ids_here].astype(np.float64))
            want_logp[row, col] = lp[list(ids_here).index(ids[row, col])]
            want_ent[row, col] = -(np.exp(lp) * lp).sum()
    np.testing.assert_allclose(logp, want_logp, atol=1e-5)
    np.testing.assert_allclose(ent, want_ent, atol=1e-5)
    assert logp[0, 3] == 0.0 and ent[0, 3] == pytest.approx(0.0, abs=1e-6)  # one allowed id
    grad = jax.grad(lambda x: kernels.next_token_logprobs_and_entropy(x, ids, allowed)[0].sum()
                    + kernels.next_token_logprobs_and_entropy(x, ids, allowed)[1].sum())(
        jnp.asarray(logits))
    assert np.isfinite(np.asarray(grad)).all()
    # Logits outside a restricted token's allowed ids get no gradient from its log-prob.
    g = jax.grad(lambda x: kernels.next_token_logprobs_and_entropy(x, ids, allowed)[0][0, 2])(
        jnp.asarray(logits))
    outside = np.setdiff1d(np.arange(v), allowed[0, 2])
    assert np.all(np.asarray(g)[0, 1, outside] == 0.0)


@pytest.mark.parametrize("chunk", [1, 4, 6, 64])
def test_chunked_logprobs_equal_the_whole_sequence_ones_with_their_gradients(chunk):
    """Logits made `chunk` positions at a time (T - 1 = 8: chunks that divide it, that do
    not, and one longer than the sequence): same values and same gradients with respect to
    the hidden states and the output matrix, with and without restricted tokens."""
    rng = np.random.default_rng(1)
    b, t, d, v, k = 2, 9, 5, 13, 3
    hidden = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(v, d)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, v, size=(b, t)), jnp.int32)
    allowed = np.full((b, t, k), -1, np.int32)
    allowed[0, 4, :2] = sorted([int(ids[0, 4]), (int(ids[0, 4]) + 1) % v])
    choices = sorted({int(ids[1, 8]), 0, 1})
    allowed[1, 8, : len(choices)] = choices
    weights = jnp.asarray(rng.normal(size=(b, t)), jnp.float32)

    def unembed(w_):
        return lambda h: jnp.einsum("btd,vd->btv", h, w_)

    def whole(h, w_, restricted):
        return kernels.next_token_logprobs_and_entropy(unembed(w_)(h), ids, restricted)

    def chunked(h, w_, restricted):
        return kernels.chunked_next_token_logprobs_and_entropy(
            h, unembed(w_), ids, restricted, chunk=chunk)

    def weighted_sum(f):
        return lambda h, w_, restricted: sum((x * weights).sum() for x in f(h, w_, restricted))

    for restricted in (None, jnp.asarray(allowed)):
        for got, want in zip(chunked(hidden, w, restricted), whole(hidden, w, restricted)):
            assert got.shape == (b, t)
            np.testing.assert_allclose(got, want, atol=1e-5)
        got = jax.grad(weighted_sum(chunked), argnums=(0, 1))(hidden, w, restricted)
        want = jax.grad(weighted_sum(whole), argnums=(0, 1))(hidden, w, restricted)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, atol=1e-4)


@pytest.mark.parametrize("chunk", [0, 2, 3, 16])
def test_logprobs_at_loss_positions_equal_the_whole_sequence_ones_there(chunk):
    """The output layer at the listed positions only (`loss_index`, 0 padded; all at once or
    `chunk` positions at a time): the whole-sequence log-probs and entropies there, 0
    elsewhere, and the same gradients as the whole-sequence ones masked to those
    positions, with and without restricted tokens."""
    from jaxrl_agents.data.packing import loss_index

    rng = np.random.default_rng(2)
    b, t, d, v, k = 3, 11, 5, 13, 3
    hidden = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(v, d)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, v, size=(b, t)), jnp.int32)
    mask = np.zeros((b, t), np.float32)
    mask[0, [2, 3, 7]] = 1
    mask[1, 1:] = 1  # every predicted position
    # row 2: no action token at all
    index = jnp.asarray(loss_index(mask, 16))
    allowed = np.full((b, t, k), -1, np.int32)
    allowed[0, 3, :2] = sorted([int(ids[0, 3]), (int(ids[0, 3]) + 1) % v])
    choices = sorted({int(ids[1, 5]), 0, 1})
    allowed[1, 5, : len(choices)] = choices
    weights = jnp.asarray(rng.normal(size=(b, t)), jnp.float32) * mask

    def unembed(w_):
        return lambda h: jnp.einsum("...d,vd->...v", h, w_)

    def whole(h, w_, restricted):
        logp, ent = kernels.next_token_logprobs_and_entropy(unembed(w_)(h), ids, restricted)
        return logp * mask, ent * mask

    def at_index(h, w_, restricted):
        return kernels.loss_positions_logprobs_and_entropy(h, unembed(w_), ids, index,
                                                           restricted, chunk=chunk)

    def weighted_sum(f):
        return lambda h, w_, restricted: sum((x * weights).sum() for x in f(h, w_, restricted))

    for restricted in (None, jnp.asarray(allowed)):
        for got, want in zip(at_index(hidden, w, restricted), whole(hidden, w, restricted)):
            assert got.shape == (b, t)
            np.testing.assert_allclose(got, want, atol=1e-5)
        got = jax.grad(weighted_sum(at_index), argnums=(0, 1))(hidden, w, restricted)
        want = jax.grad(weighted_sum(whole), argnums=(0, 1))(hidden, w, restricted)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, atol=1e-4)


def test_loss_index_lists_action_positions_in_a_shared_bucket():
    from jaxrl_agents.data.packing import loss_index

    mask = np.zeros((2, 40), np.float32)
    mask[0, [5, 6, 30]] = 1
    mask[1, 10:28] = 1
    index = loss_index(mask, 32)
    assert index.shape == (2, 32) and index.dtype == np.int32
    assert index[0, :3].tolist() == [5, 6, 30] and not index[0, 3:].any()
    assert index[1, :18].tolist() == list(range(10, 28)) and not index[1, 18:].any()
