"""The KV-cache sampler against transformers' generate and against teacher-forced forwards."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch

from jaxrl_agents.data import bucket
from jaxrl_agents.models import hf_io
from jaxrl_agents.rollout import Sampler, SamplingParams, generate
from jaxrl_agents.rollout.sampler import filter_logits
from tests.models.hf_helpers import make_hf_model

VOCAB = 97
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [3, 4, 5, 6, 7, 8, 9, 10, 11, 40, 41]]
MAX_NEW = 10
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(our model loaded through hf_io, the torch model): same random Qwen2 weights."""
    torch_model = make_hf_model("qwen2", tie=False, vocab=VOCAB, seed=1)
    path = str(tmp_path_factory.mktemp("ckpt"))
    torch_model.save_pretrained(path)
    model, _ = hf_io.load(path)
    return model, torch_model, path


def teacher_forced_logits(model, rows):
    """Float64 logits [len(row), V] of each row, from one padded full forward pass."""
    longest = max(len(r) for r in rows)
    ids = np.zeros((len(rows), longest), np.int32)
    mask = np.zeros((len(rows), longest), np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    logits = np.asarray(jax.jit(model.__call__)(ids, attention_mask=mask), np.float64)
    return [logits[i, :len(r)] for i, r in enumerate(rows)]


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_greedy_equals_transformers_generate(checkpoint):
    model, torch_model, *_ = checkpoint
    ours = generate(model, PROMPTS, MAX_NEW).tokens
    longest = max(len(p) for p in PROMPTS)
    ids = torch.zeros((len(PROMPTS), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(PROMPTS):  # transformers wants left padding for generation
        ids[i, longest - len(p):], mask[i, longest - len(p):] = torch.tensor(p), 1
    torch_model.generation_config.eos_token_id = None
    torch_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = torch_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW,
                                   do_sample=False)
    theirs = out[:, longest:].tolist()
    assert ours == theirs
    assert len({tuple(t) for t in ours}) == len(PROMPTS)  # not a degenerate model


def test_scanned_layers_sample_the_same(checkpoint):
    model, _, path = checkpoint
    scanned, _ = hf_io.load(path, scan_layers=True)
    params = SamplingParams(0.0)
    ours = Sampler(model).generate(PROMPTS, MAX_NEW, params)
    theirs = Sampler(scanned).generate(PROMPTS, MAX_NEW, params)
    assert ours.tokens == theirs.tokens
    np.testing.assert_allclose(sum(ours.logprobs, []), sum(theirs.logprobs, []), atol=1e-5)


# 150 new tokens: a 256-slot cache, decoded first in its 128-slot prefix, then in all of it.
@pytest.mark.parametrize("max_new", [MAX_NEW, 150])
@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(0.7)], ids=str)
def test_logprobs_equal_a_teacher_forced_forward(checkpoint, params, max_new):
    model, *_ = checkpoint
    result = Sampler(model).generate(PROMPTS, max_new, params, jax.random.key(3))
    assert all(len(t) == max_new for t in result.tokens)
    rows = [p + t for p, t in zip(PROMPTS, result.tokens)]
    for prompt, toks, lp, slp, logits in zip(PROMPTS, result.tokens, result.logprobs,
                                             result.sampling_logprobs,
                                             teacher_forced_logits(model, rows)):
        steps = logits[len(prompt) - 1:-1]  # the logits that predicted each new token
        tempered = log_softmax(steps / params.policy_temperature)[np.arange(len(toks)), toks]
        np.testing.assert_allclose(lp, tempered, atol=1e-5)
        if params.greedy:
            assert toks == list(steps.argmax(-1)) and slp == [0.0] * len(toks)
        else:  # no top-k / top-p: the sampled distribution is the tempered policy
            np.testing.assert_allclose(slp, tempered, atol=1e-5)


def test_fixed_key_is_reproducible(checkpoint):
    model, *_ = checkpoint
    sampler, params = Sampler(model), SamplingParams(1.0)
    first = sampler.generate(PROMPTS, MAX_NEW, params, jax.random.key(7))
    again = sampler.generate(PROMPTS, MAX_NEW, params, jax.random.key(7))
    other = sampler.generate(PROMPTS, MAX_NEW, params, jax.random.key(8))
    assert first.tokens == again.tokens and first.logprobs == again.logprobs
    assert first.tokens != other.tokens


def _allowed(logits_v, top_k, top_p, temperature, slack=1e-4):
    """NumPy reference of the kept set (with a little slack for float noise at the edge)."""
    x = logits_v / temperature
    keep = np.ones_like(x, bool)
    if top_k:
        keep &= x >= np.sort(x)[::-1][top_k - 1] - slack
    if top_p < 1.0:
        order = np.argsort(-np.where(keep, x, -np.inf))
        probs = np.exp(log_softmax(np.where(keep, x, -np.inf)))[order]
        before = np.cumsum(probs) - probs
        nucleus = order[before < top_p + slack]
        keep &= x >= x[nucleus].min() - slack
    return keep


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (5, 0.7)])
def test_top_k_top_p_never_emit_an_excluded_token(checkpoint, top_k, top_p):
    model, *_ = checkpoint
    params = SamplingParams(temperature=2.0, top_k=top_k, top_p=top_p)
    prompts = PROMPTS * 3  # more draws
    result = Sampler(model).generate(prompts, MAX_NEW, params, jax.random.key(11))
    rows = [p + t for p, t in zip(prompts, result.tokens)]
    for prompt, toks, logits in zip(prompts, result.tokens, teacher_forced_logits(model, rows)):
        steps = logits[len(prompt) - 1:-1]
        for step, tok in zip(steps, toks):
            assert _allowed(step, top_k, top_p, params.temperature)[tok]


def test_ids_past_sample_vocab_are_never_drawn(checkpoint):
    model, *_ = checkpoint
    sampler = Sampler(model, sample_vocab=10)
    params = SamplingParams(3.0)
    result = sampler.generate(PROMPTS, MAX_NEW, params, jax.random.key(5))
    assert max(max(t) for t in result.tokens) < 10
    rows = [p + t for p, t in zip(PROMPTS, result.tokens)]
    for prompt, toks, lp, logits in zip(PROMPTS, result.tokens, result.logprobs,
                                        teacher_forced_logits(model, rows)):
        steps = logits[len(prompt) - 1:-1] / params.temperature  # over the whole vocabulary
        np.testing.assert_allclose(lp, log_softmax(steps)[np.arange(len(toks)), toks],
                                   atol=1e-5)


def test_filter_logits_matches_numpy_reference():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 50)).astype(np.float32) * 3
    for top_k, top_p in [(4, 1.0), (0, 0.3), (10, 0.9), (0, 1e-6)]:
        params = SamplingParams(1.3, top_k=top_k, top_p=top_p)
        kept = np.isfinite(np.asarray(filter_logits(logits, params)))
        for row in range(6):
            expected = _allowed(logits[row], top_k, top_p, 1.3, slack=0.0)
            np.testing.assert_array_equal(kept[row], expected)
        assert kept.sum(axis=1).min() >= 1


def test_stops_at_a_stop_token_and_cuts_at_max_new_tokens(checkpoint):
    model, *_ = checkpoint
    free = generate(model, PROMPTS, MAX_NEW)
    assert [len(t) for t in free.tokens] == [MAX_NEW] * len(PROMPTS)  # never stops: cut
    stop = free.tokens[0][3]
    stopped = generate(model, PROMPTS, MAX_NEW, stop_token_ids=[stop])
    for full, cut in zip(free.tokens, stopped.tokens):
        end = full.index(stop) + 1 if stop in full else MAX_NEW
        assert cut == full[:end]
    assert len(stopped.tokens[0]) == free.tokens[0].index(stop) + 1 < MAX_NEW


def test_incremental_prefill_equals_reencoding_the_history(checkpoint):
    """Three turns on one cache (tiny cache buckets: compaction and growth happen) give
    the same tokens and log-probs as prefilling the whole history at once."""
    model, *_ = checkpoint
    sampler = Sampler(model, cache_buckets=(32, 64, 128), prefill_buckets=(4, 8, 16))
    params = SamplingParams(0.0)
    turns = [[[5, 6, 7], [12, 13, 14, 15, 16]], [[20, 21], [30]],
             [list(range(40, 49)), [50, 51]]]
    state = sampler.new_state(2, 16)
    history = [[], []]
    for turn in turns:
        state, out = sampler.extend(state, turn, 6, params, None)
        fresh = sampler.generate([h + c for h, c in zip(history, turn)], 6, params)
        for row in range(2):
            n = int(out.num_tokens[row])
            assert list(out.tokens[row, :n]) == fresh.tokens[row]
            np.testing.assert_allclose(out.logprobs[row, :n], fresh.logprobs[row], atol=1e-5)
            history[row] += turn[row] + fresh.tokens[row]
        np.testing.assert_array_equal(state.lengths, [len(h) for h in history])
    assert state.slots > 32  # the cache grew past its first bucket


def test_turns_that_start_in_later_cache_phases_match_a_full_forward(checkpoint):
    """A 512-slot cache decodes in phases over its first 128, 256 and 512 slots. Turn one
    decodes from slot 96 across 128; turn two starts at slot 220 (the 128-slot phase is
    skipped) and crosses 256. Every sampled token and log-prob must be those of one full
    forward pass over the whole history."""
    model, *_ = checkpoint
    sampler = Sampler(model, cache_buckets=(512,), prefill_buckets=(8, 16, 32, 64, 96))
    params = SamplingParams(0.0)
    rng = np.random.default_rng(5)
    turns = [[rng.integers(1, VOCAB, 90).tolist(), rng.integers(1, VOCAB, 60).tolist()],
             [rng.integers(1, VOCAB, 50).tolist(), rng.integers(1, VOCAB, 20).tolist()]]
    state = sampler.new_state(2, 16)
    history, starts = [[], []], []
    for turn in turns:
        starts.append(state.cache_index)
        state, out = sampler.extend(state, turn, 60, params, None)
        assert out.num_tokens.tolist() == [60, 60]
        logits = teacher_forced_logits(model, [h + c + out.tokens[r].tolist()
                                               for r, (h, c) in enumerate(zip(history, turn))])
        for row in range(2):
            toks = out.tokens[row].tolist()
            seen = len(history[row]) + len(turn[row])
            steps = logits[row][seen - 1:-1]
            assert toks == list(steps.argmax(-1))
            np.testing.assert_allclose(out.logprobs[row], log_softmax(steps)[np.arange(60), toks],
                                       atol=1e-5)
            history[row] += turn[row] + toks
    assert state.slots == 512 and starts == [0, 156]
    assert state.cache_index == 280  # turn two: prefill 156-219, decode 220-279


def test_bucket_and_errors(checkpoint):
    assert [bucket(n, (16, 32)) for n in (1, 16, 17, 33, 70)] == [16, 16, 32, 64, 96]
    assert bucket(3, (1, 2, 4, 8), multiple=8) == 8
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(1.0, top_p=0.0)
    with pytest.raises(ValueError, match="non-empty"):
        generate(checkpoint[0], [[1], []], 3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(checkpoint[0], [[VOCAB]], 3)


# ----------------------------------------------------------------------------- 8 devices


def test_sharded_model_samples_like_one_device():
    """On a (data 2, fsdp 2, tensor 2) mesh of 8 host devices, generation gives the same
    tokens and log-probs as on one device (child process: XLA_FLAGS must precede JAX)."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == 8
    assert report["cache_spec"] == [None, ["data", "fsdp"], "tensor", None, None]
    for kind in ("greedy", "sampled"):
        assert report[kind]["same_tokens"], report
        assert report[kind]["logprob_diff"] <= 1e-5, report


def _child():
    from flax import nnx

    from jaxrl_agents import sharding
    from jaxrl_agents.models import ModelConfig, Transformer

    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, tie_embeddings=False)
    reference = Transformer(cfg, rngs=nnx.Rngs(0))
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded = sharding.shard_params(nnx.clone(reference), mesh)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13], [14, 15], [16]]
    report = {"devices": len(jax.devices())}
    state = Sampler(sharded, mesh=mesh).new_state(4, 8)
    report["cache_spec"] = [list(a) if isinstance(a, tuple) else a
                            for a in state.cache.k.sharding.spec]
    for kind, params in (("greedy", SamplingParams(0.0)), ("sampled", SamplingParams(1.0, 5))):
        one = Sampler(reference).generate(prompts, 8, params, jax.random.key(0))
        many = Sampler(sharded, mesh=mesh).generate(prompts, 8, params, jax.random.key(0))
        diff = max(abs(a - b) for x, y in zip(one.logprobs, many.logprobs)
                   for a, b in zip(x, y))
        report[kind] = {"same_tokens": one.tokens == many.tokens, "logprob_diff": diff}
    print(json.dumps(report))


if __name__ == "__main__":
    _child()


@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(1.0),
                                    SamplingParams(1.7)], ids=str)
def test_constrained_decoding_emits_only_offered_commands(checkpoint, params):
    """Every row ends with exactly one of its commands (or is free when it has none); the
    log-probs are those of the softmax of logits / temperature over the allowed ids, and
    the learner's kernel recomputes the same numbers from the packed trajectory."""
    from jaxrl_agents import kernels
    from jaxrl_agents.data import ACTION, PROMPT, Trajectory, pack

    model, *_ = checkpoint
    stop = 1
    commands = [[[20, 21, stop], [20, 22, 23, stop], [30, stop]],
                [[40, 41, 42, 43, stop], [40, 41, 44, stop]],
                [],  # free
                [[50, stop]]]
    prompts = PROMPTS + [[5, 9, 13]]
    sampler = Sampler(model, stop_token_ids=[stop])
    for seed in range(4):
        state = sampler.new_state(sampler.batch_size(len(prompts)), 64)
        chunks = prompts + [[]] * (state.batch - len(prompts))
        choices = commands + [[]] * (state.batch - len(prompts))
        _, out = sampler.extend(state, chunks, MAX_NEW, params, jax.random.key(seed), choices)
        toks = [list(map(int, out.tokens[r, :out.num_tokens[r]])) for r in range(len(prompts))]
        for row in (0, 1, 3):
            assert toks[row] in commands[row]
        rows = [p + t for p, t in zip(prompts, toks)]
        trajs = [Trajectory(tokens=r, token_type=[PROMPT] * len(p) + [ACTION] * len(t),
                            logprobs=[0.0] * len(p) + list(out.logprobs[i, :len(t)]),
                            rewards=[0.0] * len(r), turn_ends=[len(r) - 1],
                            info={"choices": [commands[i]]})
                 for i, (p, t, r) in enumerate(zip(prompts, toks, rows))]
        batch = pack(trajs, length_buckets=(32,), choice_width=64)
        logits = np.stack([np.pad(x, ((0, 32 - len(x)), (0, 0)))
                           for x in teacher_forced_logits(model, rows)]) / params.policy_temperature
        logp, _ = kernels.next_token_logprobs_and_entropy(logits, batch.input_ids, batch.allowed)
        np.testing.assert_allclose(np.asarray(logp) * batch.action_mask, batch.old_logprobs,
                                   atol=1e-4)
        if params.greedy:
            break
    if params.greedy:  # the free row decodes as in an unconstrained call
        state = sampler.new_state(sampler.batch_size(len(prompts)), 64)
        _, free = sampler.extend(state, chunks, MAX_NEW, params, jax.random.key(0))
        np.testing.assert_array_equal(free.tokens[2], out.tokens[2])


@pytest.mark.parametrize("queries", [1, 3])
def test_cached_attention_reads_only_the_filled_prefix_and_matches_numpy(queries):
    """`cached_attention` of `queries` new tokens over a 512-slot cache (prefixes 128 / 256 /
    512 for one token, 128 / 256 / 384 / 512 for several, read one batch row at a time on
    CPU) and themselves, for cache fills in each prefix and at their edges, equals a NumPy
    softmax attention over the visible slots (holes included). The new tokens' keys and
    values come from their own arrays: the cache's entries at their slots and past them
    hold large stale values that must not leak in."""
    from jaxrl_agents.models.transformer import (
        cached_attention,
        prefill_prefix_sizes,
        prefix_sizes,
    )

    b, n, k, h, s = 2, 4, 2, 8, 512
    assert prefix_sizes(s) == [128, 256, 512]
    assert prefill_prefix_sizes(s) == [128, 256, 384, 512]
    assert prefill_prefix_sizes(3072) == [384, 768, 1152, 1536, 1920, 2304, 2688, 3072]
    assert prefill_prefix_sizes(128) == [128]
    rng = np.random.default_rng(0)
    q = rng.normal(size=(b, queries, n, h)).astype(np.float32)
    k_new = rng.normal(size=(b, queries, k, h)).astype(np.float32)
    v_new = rng.normal(size=(b, queries, k, h)).astype(np.float32)
    keys = rng.normal(size=(b, k, h, s)).astype(np.float32)  # [B, K, H, S]
    values = rng.normal(size=(b, k, s, h)).astype(np.float32)  # [B, K, S, H]
    for index in (0, 100, 125, 128, 129, 256, 300, 383, 384, 385, 509):
        filled = rng.random((b, s)) < 0.8
        filled[:, index:index + queries] = True  # this call's own slots
        filled[1, index] = False  # a padded new token in row 1
        filled[:, index + queries:] = False
        causal = np.arange(s)[None, :] < index + 1 + np.arange(queries)[:, None]
        mask = filled[:, None, :] & causal[None]  # [B, T, S]
        stale_keys, stale_values = keys.copy(), values.copy()
        stale_keys[..., index:] = 1e4
        stale_values[:, :, index:] = -1e4
        old_mask = mask & (np.arange(s) < index)
        new_mask = mask[:, :, index:index + queries]
        got = np.asarray(cached_attention(q, k_new, v_new, stale_keys, stale_values, old_mask,
                                          new_mask, index))
        want = np.zeros_like(q)
        for row in range(b):
            for t in range(queries):
                for head in range(n):
                    kv = head // (n // k)
                    all_keys = np.concatenate([keys[row, kv][:, :index], k_new[row, :, kv].T],
                                              axis=1)  # (H, index + T)
                    all_values = np.concatenate([values[row, kv][:index], v_new[row, :, kv]])
                    seen = mask[row, t, :index + queries]
                    if not seen.any():
                        continue
                    scores = q[row, t, head] @ all_keys[:, seen] / np.sqrt(h)
                    p = np.exp(scores - scores.max())
                    want[row, t, head] = (p / p.sum()) @ all_values[seen]
        visible = mask.any(axis=2)  # a padded query sees nothing: its output is unused
        np.testing.assert_allclose(got[visible], want[visible], rtol=1e-5, atol=1e-5,
                                   err_msg=f"index={index}")


def test_row_by_row_attention_equals_the_batched_form():
    """The CPU's row-by-row prefill attention (`_row_by_row`) gives what the batched form,
    which accelerators run, gives on the same rows, masks with holes included."""
    from jaxrl_agents.models.transformer import _row_by_row, _two_part_attention

    b, t, n, k, h, s = 3, 5, 4, 2, 8, 64
    rng = np.random.default_rng(1)
    q = rng.normal(size=(b, t, n, h)).astype(np.float32)
    k_new, v_new = (rng.normal(size=(b, t, k, h)).astype(np.float32) for _ in range(2))
    keys = rng.normal(size=(b, k, h, s)).astype(np.float32)
    values = rng.normal(size=(b, k, s, h)).astype(np.float32)
    old_mask = rng.random((b, 1, s)) < 0.7
    new_mask = np.tril(np.ones((t, t), bool))[None] & (rng.random((b, 1, t)) < 0.8)
    args = (q, k_new, v_new, keys, values, old_mask, new_mask)
    np.testing.assert_allclose(np.asarray(_row_by_row(_two_part_attention)(*args)),
                               np.asarray(_two_part_attention(*args)), rtol=1e-5, atol=1e-6)


def test_prefill_keeps_only_the_last_positions_logits():
    """At a 49,152-token vocabulary, the compiled prefill + decode program of a 256-token
    chunk over 4 rows needs far less scratch memory than the chunk's [B, P, V] float32
    logits (201 MB): only [B, V] of them are made. The bound is computed from the shapes:
    a few [B, V] rows, the layer activations, attention scores and the cache."""
    from flax import nnx

    from jaxrl_agents.models import ModelConfig, Transformer
    from jaxrl_agents.rollout.sampler import _extend

    cfg = ModelConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=False,
                      scan_layers=True)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    b, p, s, width = 4, 256, 384, 16
    logits, _ = model.forward_with_cache(
        np.ones((b, p), np.int32), np.tile(np.arange(p), (b, 1)), model.init_cache(b, s), 0,
        np.arange(s)[None].repeat(b, 0) < p)
    assert logits.shape == (b, cfg.vocab_size)
    sampler = Sampler(model)
    state = sampler.new_state(b, s)
    graphdef, params = nnx.split(model)
    ids, mask = np.ones((b, p), np.int32), np.ones((b, p), bool)
    compiled = _extend.lower(
        graphdef, params, state.cache, state.cache_mask, np.int32(0), ids, mask,
        state.lengths, jax.random.key(0), sampler._stop_table, sampler._allowed, None,
        np.int32(width), width=width, sampling=SamplingParams(), choice_width=64).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    all_logits = b * p * cfg.vocab_size * 4
    row_logits = b * cfg.vocab_size * 4
    scores = b * cfg.num_heads * p * s * 4  # one layer's attention scores, float32
    activations = 8 * b * p * max(cfg.intermediate_size, cfg.hidden_size) * 4
    assert temp < 16 * row_logits + 4 * scores + activations, (temp, all_logits)
    assert temp < all_logits / 4


def test_a_long_chunk_prefilled_in_pieces_samples_the_same(checkpoint):
    """With `max_prefill` 4, the prompts (7, 2 and 11 tokens) are prefilled in pieces of at
    most 4 tokens before decoding: the same tokens and log-probs as in one prefill."""
    model, _, _ = checkpoint
    params = SamplingParams(temperature=1.0)
    whole = Sampler(model).generate(PROMPTS, MAX_NEW, params, jax.random.key(3))
    pieces = Sampler(model, max_prefill=4).generate(PROMPTS, MAX_NEW, params,
                                                    jax.random.key(3))
    assert pieces.tokens == whole.tokens
    for got, want in zip(pieces.logprobs, whole.logprobs):
        np.testing.assert_allclose(got, want, atol=2e-5)


def _bigram_model(table):
    """A one-layer decoder whose next-token logits depend on the current token only:
    logits(next | cur) = table[cur, next]. Attention and MLP outputs are zeroed, so the
    final hidden state is the normalised one-hot embedding of the current token."""
    from flax import nnx

    from jaxrl_agents.models import ModelConfig, Transformer

    v = table.shape[0]
    cfg = ModelConfig(vocab_size=v, hidden_size=v, intermediate_size=2 * v, num_layers=1,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=False,
                      tie_embeddings=False)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    model.embed_tokens[...] = np.eye(v, dtype=np.float32)
    layer = model.layers[0]
    layer.attn.o_proj[...] = np.zeros_like(layer.attn.o_proj[...])
    layer.mlp.down_proj[...] = np.zeros_like(layer.mlp.down_proj[...])
    # rms_norm of a one-hot vector is sqrt(D) times it
    model.lm_head[...] = (table.T / np.sqrt(v)).astype(np.float32)
    return model


def test_greedy_plays_the_most_likely_command_not_the_most_likely_first_token():
    """Commands "take a", "take b", "take c" at 0.2 each and "put x" at 0.4 (first token
    "take" 0.6 against "put" 0.4): greedy by command plays "put x", token-level greedy
    "take a"; both record the log-probs of the constrained policy."""
    stop, take, put, a, b, c, x = 2, 5, 6, 7, 8, 9, 10
    table = np.zeros((32, 32))
    table[1, take], table[1, put] = np.log(0.6), np.log(0.4)  # after the prompt's token 1
    table[take, [a, b, c]] = 0.0  # a, b, c equally likely after "take"
    for t in (a, b, c, x):
        table[t, stop] = 3.0
    table[put, x] = 3.0
    model = _bigram_model(table)
    commands = [[take, a, stop], [take, b, stop], [take, c, stop], [put, x, stop]]
    sampler = Sampler(model, stop_token_ids=[stop])
    played = {}
    for by_command in (True, False):
        state = sampler.new_state(1, 32)
        greedy = SamplingParams(0.0, greedy_by_command=by_command)
        _, out = sampler.extend(state, [[3, 1]], 4, greedy, jax.random.key(0), [commands])
        n = int(out.num_tokens[0])
        played[by_command] = (list(map(int, out.tokens[0, :n])), float(out.logprobs[0, :n].sum()))
    assert played[True][0] == [put, x, stop]
    assert played[True][1] == pytest.approx(np.log(0.4), abs=1e-4)
    assert played[False][0] == [take, a, stop]
    assert played[False][1] == pytest.approx(np.log(0.2), abs=1e-4)


def test_greedy_by_command_plays_the_argmax_of_teacher_forced_command_log_probs(checkpoint):
    """On a real (random) checkpoint with commands sharing prefixes: each row plays the
    command whose summed log-prob under the constrained policy, recomputed by the
    learner's kernel from a full forward pass, is highest, and records that sum."""
    from jaxrl_agents import kernels
    from jaxrl_agents.data import ACTION, PROMPT, Trajectory, pack

    model, *_ = checkpoint
    stop = 1
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, 90, 5)) for _ in range(4)]
    commands = []
    for _ in range(4):
        heads = rng.integers(3, 90, 2)
        commands.append([[int(heads[i % 2]), *map(int, rng.integers(3, 90, 1 + i % 3)), stop]
                         for i in range(5)])
    sampler = Sampler(model, stop_token_ids=[stop])
    state = sampler.new_state(4, 64)
    _, out = sampler.extend(state, prompts, MAX_NEW, SamplingParams(0.0), jax.random.key(0),
                            commands)
    for row in range(4):
        trajs = [Trajectory(tokens=prompts[row] + cmd,
                            token_type=[PROMPT] * len(prompts[row]) + [ACTION] * len(cmd),
                            logprobs=[0.0] * (len(prompts[row]) + len(cmd)),
                            rewards=[0.0] * (len(prompts[row]) + len(cmd)),
                            turn_ends=[len(prompts[row]) + len(cmd) - 1],
                            info={"choices": [commands[row]]}) for cmd in commands[row]]
        batch = pack(trajs, length_buckets=(32,), choice_width=64)
        rows = [t.tokens for t in trajs]
        logits = np.stack([np.pad(x, ((0, 32 - len(x)), (0, 0)))
                           for x in teacher_forced_logits(model, rows)])
        logp, _ = kernels.next_token_logprobs_and_entropy(logits, batch.input_ids, batch.allowed)
        totals = (np.asarray(logp) * batch.action_mask).sum(axis=1)
        n = int(out.num_tokens[row])
        assert list(map(int, out.tokens[row, :n])) == commands[row][int(np.argmax(totals))]
        assert float(out.logprobs[row, :n].sum()) == pytest.approx(totals.max(), abs=1e-4)


def test_greedy_by_command_over_turns_equals_teacher_forcing_the_whole_episode(checkpoint):
    """Two turns played greedily by command: the first turn's command is not decoded but
    written ahead of the second chunk (`DecodeState.unwritten`), so the second turn's
    choice and every token's log-prob equal those of a full forward pass over prompt,
    command, observation and each candidate command."""
    from jaxrl_agents import kernels
    from jaxrl_agents.data import ACTION, PROMPT, Trajectory, pack

    model, *_ = checkpoint
    stop = 1
    rng = np.random.default_rng(3)

    def offered():
        heads = rng.integers(3, 90, 2)
        return [[int(heads[i % 2]), *map(int, rng.integers(3, 90, 1 + i % 3)), stop]
                for i in range(4)]

    prompts = [list(map(int, rng.integers(3, 90, 4 + row))) for row in range(3)]
    observations = [list(map(int, rng.integers(3, 90, 3))) for _ in range(3)]
    first, second = [offered() for _ in range(3)], [offered() for _ in range(3)]
    sampler = Sampler(model, stop_token_ids=[stop])
    greedy = SamplingParams(0.0)
    state, out1 = sampler.extend(sampler.new_state(4, 64), prompts + [[]], MAX_NEW, greedy,
                                 jax.random.key(0), first + [[]])
    played1 = [list(map(int, out1.tokens[r, :int(out1.num_tokens[r])])) for r in range(3)]
    assert [list(w) for w in state.unwritten[:3]] == played1 and state.unwritten[3] == ()
    index = state.cache_index
    # row 1 sits the second turn out: its command stays unwritten
    chunks = [observations[0], [], observations[2], []]
    state, out2 = sampler.extend(state, chunks, MAX_NEW, greedy, jax.random.key(0),
                                 [second[0], [], second[2], []])
    assert state.unwritten[1] == tuple(played1[1]) and int(out2.num_tokens[1]) == 0
    longest = max(len(played1[r]) + len(observations[r]) for r in (0, 2))
    assert state.cache_index - index == bucket(longest, sampler.prefill_buckets)  # no decode
    for row in (0, 2):
        head = prompts[row] + played1[row] + observations[row]
        kinds = ([PROMPT] * len(prompts[row]) + [ACTION] * len(played1[row])
                 + [PROMPT] * len(observations[row]))
        trajs = [Trajectory(tokens=head + cmd, token_type=kinds + [ACTION] * len(cmd),
                            logprobs=[0.0] * (len(head) + len(cmd)),
                            rewards=[0.0] * (len(head) + len(cmd)),
                            turn_ends=[len(prompts[row]) + len(played1[row]) - 1,
                                       len(head) + len(cmd) - 1],
                            info={"choices": [first[row], second[row]]}) for cmd in second[row]]
        batch = pack(trajs, length_buckets=(32,), choice_width=64)
        logits = np.stack([np.pad(x, ((0, 32 - len(x)), (0, 0)))
                           for x in teacher_forced_logits(model, [t.tokens for t in trajs])])
        logp, _ = kernels.next_token_logprobs_and_entropy(logits, batch.input_ids, batch.allowed)
        logp = np.asarray(logp)
        tail = np.asarray(batch.action_mask).copy()
        tail[:, :len(head)] = 0  # the second command's tokens
        best = int(np.argmax((logp * tail).sum(axis=1)))
        n = int(out2.num_tokens[row])
        assert list(map(int, out2.tokens[row, :n])) == second[row][best]
        want = logp[best, len(head):len(head) + n]
        np.testing.assert_allclose(out2.logprobs[row, :n], want, atol=1e-4)
        # the first turn's tokens, recorded before they were in the cache, agree too
        np.testing.assert_allclose(out1.logprobs[row, :len(played1[row])],
                                   logp[best, len(prompts[row]):len(prompts[row])
                                        + len(played1[row])], atol=1e-4)


@pytest.mark.parametrize("by_command", [False, True], ids=["sampled", "greedy_by_command"])
def test_captured_hidden_states_are_the_first_layers_output_over_the_whole_row(checkpoint,
                                                                               by_command):
    """`capture=1`: over three turns (prompts prefilled in pieces of 4, a cache that compacts
    and grows, a row sitting a turn out, commands written ahead of the next chunk when
    played by command), the ids each call reports fed are the row's history in order, and
    their hidden states are those `lower_hidden(.., 1)` gives over the whole row."""
    model, *_ = checkpoint
    stop = 1
    sampler = Sampler(model, stop_token_ids=[stop], cache_buckets=(32, 64, 128),
                      prefill_buckets=(4, 8, 16), max_prefill=4)
    rng = np.random.default_rng(5)
    params = SamplingParams(0.0) if by_command else SamplingParams(1.0)
    state = sampler.new_state(3, 16)
    played, fed_ids, fed_hidden = [[], [], []], [[], [], []], [[], [], []]
    for turn in range(3):
        chunks = [list(map(int, rng.integers(3, 90, 2 + 4 * row + turn))) for row in range(3)]
        if turn == 1:
            chunks[1] = []
        choices = None
        if by_command:
            choices = [[[int(rng.integers(3, 90)), int(rng.integers(3, 90)), stop]
                        for _ in range(3)] if chunk else [] for chunk in chunks]
        state, out = sampler.extend(state, chunks, 6, params, jax.random.key(turn), choices,
                                    capture=1)
        for row in range(3):
            n = int(out.num_tokens[row])
            played[row] += chunks[row] + list(map(int, out.tokens[row, :n]))
            fed_ids[row] += list(out.fed[row])
            fed_hidden[row].append(out.fed_hidden[row])
            assert len(out.fed[row]) == len(out.fed_hidden[row])
    assert state.slots > 32
    for row in range(3):
        ids = np.asarray(played[row], np.int32)[None]
        unwritten = len(state.unwritten[row]) if state.unwritten else 0
        assert fed_ids[row] == played[row][:len(played[row]) - unwritten]
        assert unwritten == (int(out.num_tokens[row]) if by_command else 0)
        want = np.asarray(model.lower_hidden(ids, n=1))[0, :len(fed_ids[row])]
        np.testing.assert_allclose(np.concatenate(fed_hidden[row]), want, atol=1e-4)
