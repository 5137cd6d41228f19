"""The sampler: prefill a chunk of tokens, then decode inside one `lax.while_loop`.

The sampler owns sampling, stopping, constrained decoding and the decode loop; the
model owns the decoder, attention, the KV cache (`KVCache`) and RoPE: prefill and every
decode step run through `Transformer.forward_with_cache`, the same layers the learner
trains (so the sampler's log-probs equal the learner's, tests/rollout/test_sampler.py).
With `model.scan_layers` the layers run under `lax.scan`, so the programs' compile time
does not grow with depth.

One call of the compiled program (`_extend`) writes a chunk of new tokens (a prompt, or the
observation of a new turn) onto a preallocated cache and then samples up to `max_new` tokens,
so a whole generation is one device call. Programs are compiled per shape bucket: batch B,
chunk length P and cache length S are rounded up to a few sizes (`bucket`), and sampling
settings are static, so a run compiles a handful of programs. Prefill keeps the logits of
the chunk's last position only ([B, V], never [B, P, V]).

Cache layout. All rows of a call write the same slots, so rows are left-padded inside a
chunk and the decode slots of a row that already stopped stay masked: a row's real tokens
sit in the cache with holes in between. RoPE positions count real tokens only, so the holes
change nothing; `_compact` squeezes them out (stable, per row) when the cache would
overflow, and `_grow` pads the cache to the next size bucket when that is not enough.
The decode loop runs in phases over growing prefixes of the cache (S/8, S/4, S/2, S; none
under 128 slots): each phase reads and writes only its prefix, cut from the cache once when
the phase starts and written back once when it ends.

Shape letters: B batch, P chunk length, M max new tokens, S cache slots, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_agents.data.choices import command_tree
from jaxrl_agents.data.packing import bucket
from jaxrl_agents.models.transformer import KEY_AXES, VALUE_AXES, KVCache, prefix_sizes

# Steps of 64 from 128 to 512, where a turn's observation falls (150-350 tokens for the
# real-model recipe: every row of a chunk is padded to its bucket), about 1.5x past that:
# little padding, a handful of compiled programs per run.
PREFILL_BUCKETS = (16, 32, 64, 128, 192, 256, 320, 384, 448, 512, 768, 1024, 1536, 2048)
CACHE_BUCKETS = (128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Commands offered per row (constrained decoding). Coarse: the per-step constraint costs
# little at any width, while every width is one more compiled program per shape.
CHOICE_BUCKETS = (16, 64, 256)
# Tokens a call may decode, as compiled: the call's own `max_new` is a traced limit under it.
DECODE_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)
DEFAULT_CHOICE_WIDTH = 64  # a step with more distinct candidate ids is not constrained
# Nodes of a row's command tree (greedy play by command), as compiled.
TREE_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)
# The most tokens one prefill writes; a longer chunk is prefilled in pieces (`extend`).
MAX_PREFILL = 512
_NEG_INF = -jnp.inf


# ----------------------------------------------------------------------------- sampling maths


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn; static in the compiled program (hashable).

    temperature: 0 is greedy (argmax of the raw logits); otherwise logits are divided by it.
    top_k: keep the k most likely tokens (0 = off). top_p: keep the smallest set of most
    likely tokens whose probability reaches top_p (1.0 = off). Order: temperature, top-k,
    top-p (as transformers does).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    # Greedy play under constrained decoding: the offered command of highest total
    # log-probability (`command_scores`), or, when False, the argmax token at each step
    # (which can pick a command no more likely than others sharing its first token).
    greedy_by_command: bool = True

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def policy_temperature(self) -> float:
        """T of the policy softmax(logits / T) whose log-probs are recorded (1 when greedy)."""
        return 1.0 if self.greedy else self.temperature


def filter_logits(logits_bv, params: SamplingParams):
    """Temperature-scaled logits with tokens outside top-k / top-p set to -inf. [B, V] f32."""
    x = logits_bv.astype(jnp.float32) / params.temperature
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        kth = jax.lax.top_k(x, params.top_k)[0][:, -1:]  # (B, 1)
        x = jnp.where(x >= kth, x, _NEG_INF)
    if params.top_p < 1.0:
        sorted_x = jnp.sort(x, axis=-1)[:, ::-1]  # (B, V), descending
        probs = jax.nn.softmax(sorted_x, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        kept = mass_before < params.top_p  # the first token is always kept
        threshold = jnp.min(jnp.where(kept, sorted_x, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x >= threshold, x, _NEG_INF)
    return x


def sample_tokens(logits_bv, key, params: SamplingParams, allowed_v=None, constraint_bv=None,
                  forced_b=None):
    """Draws one token per row, never one with `allowed_v[token]` False ([V] bool, e.g.
    the padding rows of a vocabulary larger than the tokenizer's) nor, where given, one with
    `constraint_bv[row, token]` False ([B, V] bool: constrained decoding). `forced_b` [B]
    int32: where >= 0, that token instead of a drawn one (greedy play by command).

    Returns (tokens [B] int32, policy log-probs [B] under softmax(logits / temperature)
    over the whole vocabulary, or over the row's constraint (temperature 1 when greedy):
    the policy the RL learner trains, which scales its logits the same way; sampling
    log-probs [B] under the distribution actually sampled from, top-k / top-p included;
    0 for greedy, which is deterministic).
    """
    if constraint_bv is not None:
        logits_bv = jnp.where(constraint_bv, logits_bv, _NEG_INF)
    raw = jax.nn.log_softmax(logits_bv.astype(jnp.float32) / params.policy_temperature, axis=-1)
    if allowed_v is not None:
        logits_bv = jnp.where(allowed_v[None, :], logits_bv, _NEG_INF)
    if params.greedy:
        tokens = jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
        sampling = jnp.zeros(tokens.shape, jnp.float32)
    else:
        filtered = filter_logits(logits_bv, params)
        tokens = jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)
        logp = jax.nn.log_softmax(filtered, axis=-1)
        sampling = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    if forced_b is not None:
        tokens = jnp.where(forced_b >= 0, forced_b, tokens)
    picked = jnp.take_along_axis(raw, tokens[:, None], axis=-1)[:, 0]
    return tokens, picked, sampling


def choice_constraint(choice_ids_bcl, alive_bc, step, vocab: int, width: int):
    """The constrained-decoding mask of decode step `step` (the rule of `data.choices`).

    choice_ids_bcl: [B, C, L] int32, each row's offered commands as token ids (-1 padded).
    alive_bc: [B, C] bool, the commands that agree with the tokens sampled so far.
    Returns (constraint [B, V] bool, candidates [B, C] int32 (-1: none)): a row is
    restricted to its candidates' ids unless it has none or more than `width` distinct.
    """
    b, _, length = choice_ids_bcl.shape
    column = jax.lax.dynamic_index_in_dim(choice_ids_bcl, jnp.minimum(step, length - 1), axis=2,
                                          keepdims=False)
    cand = jnp.where(alive_bc & (step < length), column, -1)  # (B, C)
    rows = jnp.arange(b)[:, None]
    allowed = jnp.zeros((b, vocab), bool).at[rows, jnp.where(cand >= 0, cand, vocab)].set(
        True, mode="drop")
    count = allowed.sum(axis=-1)
    constrained = (count > 0) & (count <= width)
    return allowed | ~constrained[:, None], cand


class CommandTree(NamedTuple):
    """Each row's offered commands as one token tree (`data.choices.command_tree`), padded
    to N nodes: `tokens` [B, N] int32, `parents` [B, N] int32 (-1: a first token, or
    padding), `depths` [B, N] int32 (a node's prefix length; 0 on padding), `seen`
    [B, N, N] bool (node i's ancestors and itself: what its token attends to), `leaves`
    [B, C] int32 (the node of command c's last token, as laid out in the choice array;
    -1: no command)."""

    tokens: jax.Array
    parents: jax.Array
    depths: jax.Array
    seen: jax.Array
    leaves: jax.Array


def command_scores(model, first_logits_bv, cache, cache_mask, slot, lengths, tree: CommandTree,
                   width: int, full_vocab: bool):
    """Total log-probability of every offered command under the constrained policy
    (temperature 1): [B, C] float32, -inf where there is no command; and each tree node's
    token log-prob given its prefix, [B, N] (0 on padding).

    All commands of a row are run at once as a tree after the cache's tokens (each node
    sees the cache and its own ancestors; the cache is not written). A token's log-prob is
    its logit minus the log-sum-exp over its siblings (the ids constrained decoding allows
    after its prefix), or over the whole vocabulary where the prefix has more than `width`
    children (only computed with the static `full_vocab`). first_logits_bv [B, V]: the
    logits after the cache's last token (for first tokens); lengths [B]: tokens per row.
    """
    real = tree.depths > 0  # (B, N)
    positions = lengths[:, None] + jnp.maximum(tree.depths - 1, 0)
    hidden, _ = model.forward_with_cache(tree.tokens, positions, cache, slot, cache_mask,
                                         last_only=None, new_mask=tree.seen, write=False)
    above = jnp.take_along_axis(hidden, jnp.maximum(tree.parents, 0)[..., None], axis=1)
    edge = model.logits_at(above, tree.tokens[..., None])[..., 0]  # (B, N)
    first = jnp.take_along_axis(first_logits_bv, tree.tokens, axis=1)
    is_first = tree.parents < 0
    edge = jnp.where(is_first, first, edge)
    siblings = ((tree.parents[:, :, None] == tree.parents[:, None, :])
                & real[:, :, None] & real[:, None, :])  # (B, N, N)
    lse = jax.nn.logsumexp(jnp.where(siblings, edge[:, None, :], _NEG_INF), axis=-1)
    if full_vocab:
        whole = jnp.where(is_first, jax.nn.logsumexp(first_logits_bv, axis=-1)[:, None],
                          jax.nn.logsumexp(model.logits(above), axis=-1))
        lse = jnp.where(siblings.sum(axis=-1) <= width, lse, whole)
    logp = jnp.where(real, edge - lse, 0.0)  # (B, N): each node's token given its prefix
    path = jnp.take_along_axis(tree.seen, jnp.maximum(tree.leaves, 0)[..., None], axis=1)
    scores = jnp.einsum("bcn,bn->bc", path.astype(jnp.float32), logp)
    return jnp.where(tree.leaves >= 0, scores, _NEG_INF), logp


def command_token_logprobs(tree: CommandTree, node_logp, command, width: int):
    """The log-probs [B, width] of the tokens of each row's `command` [B] (an index into
    the leaves) in order, from the tree's node log-probs [B, N]; 0 past its end."""
    leaf = jnp.take_along_axis(tree.leaves, command[:, None], axis=1)  # (B, 1)
    path = jnp.take_along_axis(tree.seen, jnp.maximum(leaf, 0)[..., None], axis=1)[:, 0]
    at = path[:, :, None] & (tree.depths[:, :, None] == jnp.arange(1, width + 1))  # (B, N, W)
    return jnp.einsum("bn,bnw->bw", node_logp, at.astype(jnp.float32))


# ----------------------------------------------------------------------------- state


class DecodeState(NamedTuple):
    """The cache of B rows between calls.

    cache: the model's `KVCache`, k [L, B, K, H, S] and v [L, B, K, S, H]. cache_mask: [B, S]
    bool, slots holding real tokens. cache_index: first free slot (host int; all rows share
    it). lengths: [B] int32 numpy, real tokens per row (the RoPE position of the next token).
    unwritten: per row, tokens already played but not yet in the cache (an action played
    greedily by command, see `Sampler.extend`), written ahead of the row's next chunk; ()
    when there are none.
    """

    cache: KVCache
    cache_mask: jax.Array
    cache_index: int
    lengths: np.ndarray
    unwritten: tuple = ()

    @property
    def batch(self) -> int:
        return int(self.cache_mask.shape[0])

    @property
    def slots(self) -> int:
        return int(self.cache_mask.shape[1])


class ChunkOutput(NamedTuple):
    """What one `extend` call samples: tokens, raw and sampling log-probs [B, M], and the
    number of tokens each row produced [B] (tokens past it are padding). With `extend`'s
    `capture` n > 0, per row the ids the call fed to the model, in order ([F] int32: the
    row's chunk, then the tokens it decoded), and their residual stream after the first n
    layers ([F, D] float32); else None."""

    tokens: np.ndarray
    logprobs: np.ndarray
    sampling_logprobs: np.ndarray
    num_tokens: np.ndarray
    fed: list | None = None
    fed_hidden: list | None = None


@dataclasses.dataclass
class GenerationResult:
    """Per prompt: sampled ids, their log-probs under the policy at the sampling temperature
    (softmax(logits / temperature); raw logits when greedy), and under the sampling
    distribution (temperature and top-k / top-p filters applied; 0.0 for greedy)."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    sampling_logprobs: list[list[float]] = dataclasses.field(default_factory=list)


# ----------------------------------------------------------------------------- compiled steps


class _Loop(NamedTuple):
    """The decode loop's state: `step` tokens decoded so far, the `logits` [B, V] the next
    token is drawn from, the cache and its mask [B, S], `lengths` [B] (real tokens per
    row: the RoPE position of the next one), `done` [B], the PRNG `key`, the outputs so far
    (`tokens`, `logprobs`, `sampling_logprobs` [B, width]) and, under constrained decoding,
    `alive` [B, C]: the commands that agree with the tokens drawn so far. `hidden`
    [B, width, D]: with `capture`, each decoded token's residual stream after the first
    `capture` layers (else [B, 0])."""

    step: jax.Array
    logits: jax.Array
    cache: KVCache
    cache_mask: jax.Array
    lengths: jax.Array
    done: jax.Array
    key: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    sampling_logprobs: jax.Array
    alive: jax.Array
    hidden: jax.Array


@functools.partial(jax.jit, static_argnames=("graphdef", "width", "sampling", "choice_width",
                                             "full_vocab", "decode", "capture"),
                   donate_argnames=("cache", "cache_mask"))
def _extend(graphdef, params, cache, cache_mask, cache_index, chunk_ids, chunk_mask, lengths,
            key, stop_table, allowed, choice_ids, max_new, tree=None, *, width: int,
            sampling: SamplingParams, choice_width: int, full_vocab: bool = False,
            decode: bool = True, capture: int = 0):
    """Prefill a left-padded chunk [B, P] at slots [cache_index, cache_index + P), then
    decode up to `max_new` tokens at the slots after it, all through the model's
    `forward_with_cache`.

    Rows whose chunk is all padding do not decode. A row stops after a token with
    `stop_table[token]` or after `max_new` tokens (a traced limit, at most the static `width`
    of the token buffers, so calls with different limits share a program). Tokens with
    `allowed[token]` False are never drawn; with `choice_ids` [B, C, width] (-1 padded;
    None: no constraint, and no per-step masking work) a row only draws tokens that continue
    one of its commands (`choice_constraint`). With a command `tree` (greedy play by
    command), each row plays its command of highest total log-probability
    (`command_scores`), token by token under the same constraint, so its log-probs are
    those a sampled play of it would record. Every sampled token (the stopping one too)
    is written to the cache, so the next chunk starts right after it. With a tree and
    `decode` False (every row with a chunk has commands), nothing is decoded: each row's
    command is returned with its log-probs from the tree, up to its first stop token and
    `max_new` tokens, and is not written to the cache (the caller writes it ahead of the
    row's next chunk); the decode steps taken are then 0.
    Returns (tokens, raw logp, sampling logp [B, width], counts [B], cache, cache_mask,
    lengths [B], decode steps taken, hidden states): with `capture` n > 0, the residual
    stream after the first n layers of the chunk's tokens [B, P, D] and of the decoded ones
    [B, width, D] (`Transformer.forward_with_cache`); else two empty arrays.
    """
    model = nnx.merge(graphdef, params)
    b, p = chunk_ids.shape
    chunk_mask = chunk_mask.astype(bool)
    positions = jnp.maximum(lengths[:, None] + jnp.cumsum(chunk_mask, axis=1) - 1, 0)  # (B, P)
    cache_mask = jax.lax.dynamic_update_slice(cache_mask, chunk_mask, (0, cache_index))

    def forward(ids, *args, **kwargs):
        """The cached forward -> (logits, cache, the captured hidden states [B, T, D]
        float32, or [B, 0] without `capture`)."""
        if not capture:
            return (*model.forward_with_cache(ids, *args, **kwargs),
                    jnp.zeros((ids.shape[0], 0), jnp.float32))
        logits, cache, kept = model.forward_with_cache(ids, *args, capture=capture, **kwargs)
        return logits, cache, kept.astype(jnp.float32)

    logits, cache, chunk_hidden = forward(chunk_ids, positions, cache, cache_index, cache_mask)
    first_slot = cache_index + p  # where the first decoded token goes
    prefilled = lengths + chunk_mask.sum(axis=1, dtype=jnp.int32)  # (B,)
    forced = None
    if tree is not None:
        scores, node_logp = command_scores(model, logits, cache, cache_mask, first_slot,
                                           prefilled, tree, choice_width, full_vocab)
        best = jnp.argmax(scores, axis=1)  # (B,); a row without commands gets -1s below
        forced = jnp.take_along_axis(choice_ids, best[:, None, None], axis=1)[:, 0]  # (B, W)
        if not decode:
            logp = command_token_logprobs(tree, node_logp, best, width)
            return (*_played_by_command(forced, logp, chunk_mask.any(axis=1), max_new,
                                        stop_table, cache, cache_mask, prefilled),
                    chunk_hidden, jnp.zeros((b, 0), jnp.float32))

    def due(loop: _Loop):
        return (loop.step < max_new) & ~jnp.all(loop.done)

    def step(loop: _Loop) -> _Loop:
        key, sub = jax.random.split(loop.key)
        alive = loop.alive
        if choice_ids is None:
            tok, raw, samp = sample_tokens(loop.logits, sub, sampling, allowed)
        else:
            constraint, cand = choice_constraint(choice_ids, alive, loop.step,
                                                 loop.logits.shape[-1], choice_width)
            now = None if forced is None else jax.lax.dynamic_index_in_dim(
                forced, loop.step, axis=1, keepdims=False)
            tok, raw, samp = sample_tokens(loop.logits, sub, sampling, allowed, constraint, now)
            alive = alive & (cand == tok[:, None])
        live = ~loop.done
        tok = jnp.where(live, tok, 0)
        i, slot = loop.step, first_slot + loop.step
        cache_mask = jax.lax.dynamic_update_slice(loop.cache_mask, live[:, None], (0, slot))
        logits, cache, fed = forward(tok[:, None], loop.lengths[:, None], loop.cache, slot,
                                     cache_mask, prefixes=False)
        hidden = loop.hidden.at[:, i].set(fed[:, 0]) if capture else loop.hidden
        return _Loop(
            step=i + 1, logits=logits, cache=cache, cache_mask=cache_mask,
            lengths=loop.lengths + live.astype(jnp.int32),
            done=loop.done | (live & stop_table[tok]) | (i + 1 >= max_new), key=key,
            tokens=loop.tokens.at[:, i].set(tok),
            logprobs=loop.logprobs.at[:, i].set(jnp.where(live, raw, 0.0)),
            sampling_logprobs=loop.sampling_logprobs.at[:, i].set(jnp.where(live, samp, 0.0)),
            alive=alive, hidden=hidden)

    def in_phase(loop: _Loop, n):
        """The next decode step is due and its slot is below n."""
        return due(loop) & (first_slot + loop.step < n)

    def phase(loop: _Loop, n) -> _Loop:
        """The decode steps whose slot is below n, run on the cache's first n slots."""
        head = loop._replace(cache=loop.cache.prefix(n), cache_mask=loop.cache_mask[:, :n])
        head = jax.lax.while_loop(functools.partial(in_phase, n=n), step, head)
        return head._replace(
            cache=loop.cache.with_prefix(head.cache),
            cache_mask=jax.lax.dynamic_update_slice(loop.cache_mask, head.cache_mask, (0, 0)))

    zeros = jnp.zeros((b, width), jnp.float32)
    loop = _Loop(
        step=jnp.int32(0), logits=logits, cache=cache, cache_mask=cache_mask,
        lengths=prefilled, done=~chunk_mask.any(axis=1),
        key=key, tokens=jnp.zeros((b, width), jnp.int32), logprobs=zeros,
        sampling_logprobs=zeros,
        alive=jnp.zeros((b, 0), bool) if choice_ids is None else choice_ids[:, :, 0] >= 0,
        hidden=jnp.zeros((b, width, chunk_hidden.shape[-1]) if capture else (b, 0),
                         jnp.float32))
    # Decode in phases over growing cache prefixes (`prefix_sizes`): a step reads only the
    # prefix it writes into, and a prefix is cut and written back once per phase rather than
    # at every step. A phase that holds no step is skipped.
    *smaller, _ = prefix_sizes(cache_mask.shape[1])
    for n in smaller:
        loop = jax.lax.cond(in_phase(loop, n), functools.partial(phase, n=n), lambda x: x, loop)
    loop = jax.lax.while_loop(due, step, loop)
    counts = loop.lengths - prefilled
    return (loop.tokens, loop.logprobs, loop.sampling_logprobs, counts, loop.cache,
            loop.cache_mask, loop.lengths, loop.step, chunk_hidden, loop.hidden)


def _played_by_command(command_bw, logp_bw, active_b, max_new, stop_table, cache, cache_mask,
                       lengths):
    """`_extend`'s outputs for commands played without decoding: each active row's tokens
    [B, W] (-1 padded) up to its first stop token and `max_new` tokens, as the decode loop
    would have drawn them; nothing written to the cache, no decode step."""
    w = command_bw.shape[1]
    real = (command_bw >= 0) & active_b[:, None] & (jnp.arange(w) < max_new)
    stops = real & stop_table[jnp.maximum(command_bw, 0)]
    # a token after the first stop is not played: no stop strictly before it
    real = real & (jnp.cumsum(stops, axis=1) - stops == 0)
    tokens = jnp.where(real, command_bw, 0)
    logp = jnp.where(real, logp_bw, 0.0)
    return (tokens, logp, jnp.zeros_like(logp), real.sum(axis=1, dtype=jnp.int32), cache,
            cache_mask, lengths, jnp.int32(0))


def _fed_rows(chunks, tokens_bw, counts_b, chunk_hidden_bpd, decoded_hidden_bwd, *,
              decoded: bool):
    """Per row, the ids one `_extend` call fed to the model in order, [F] int32, and their
    captured hidden states [F, D]: the row's chunk (the real end of the left-padded
    [B, P, D]), then, when the call decoded, every token it drew (each is fed to draw the
    next, the stopping one too)."""
    fed, hidden = [], []
    for row, chunk in enumerate(chunks):
        n = len(chunk)
        ids, states = [np.asarray(chunk, np.int32)], [chunk_hidden_bpd[row, -n:] if n else
                                                      chunk_hidden_bpd[row, :0]]
        if decoded and n:
            ids.append(np.asarray(tokens_bw[row, :counts_b[row]], np.int32))
            states.append(decoded_hidden_bwd[row, :counts_b[row]])
        fed.append(np.concatenate(ids))
        hidden.append(np.concatenate(states))
    return fed, hidden


_KEY_SLOT_AXIS, _VALUE_SLOT_AXIS = KEY_AXES.index("length"), VALUE_AXES.index("length")


def _take_unwritten(chunks, state: DecodeState):
    """Each row's unwritten tokens put ahead of its chunk (a row without a chunk keeps
    them for a later call) -> (chunks, state without them)."""
    if not any(state.unwritten):
        return chunks, state
    chunks = [list(w) + list(c) if len(c) else list(c)
              for w, c in zip(state.unwritten, chunks, strict=True)]
    kept = tuple(w if not len(c) else () for w, c in zip(state.unwritten, chunks))
    return chunks, state._replace(unwritten=kept if any(kept) else ())


@jax.jit
def _compact(cache: KVCache, cache_mask):
    """Moves each row's real slots to the front, in order; returns (cache, mask, max count)."""
    order = jnp.argsort(~cache_mask, axis=1, stable=True)  # (B, S): real slots first
    cache = KVCache(
        jnp.take_along_axis(cache.k, order[None, :, None, None, :], axis=_KEY_SLOT_AXIS),
        jnp.take_along_axis(cache.v, order[None, :, None, :, None], axis=_VALUE_SLOT_AXIS))
    mask = jnp.take_along_axis(cache_mask, order, axis=1)
    return cache, mask, jnp.max(jnp.sum(cache_mask, axis=1))


@functools.partial(jax.jit, static_argnames=("slots",))
def _grow(cache: KVCache, cache_mask, *, slots: int):
    """Pads the cache with empty slots up to `slots`."""
    extra = slots - cache_mask.shape[1]
    pad = lambda x, axis: jnp.pad(x, [(0, extra if a == axis else 0) for a in range(x.ndim)])  # noqa: E731
    return (KVCache(pad(cache.k, _KEY_SLOT_AXIS), pad(cache.v, _VALUE_SLOT_AXIS)),
            pad(cache_mask, 1))


# ----------------------------------------------------------------------------- the sampler


def stop_table_for(vocab_size: int, stop_token_ids: Sequence[int] = ()) -> np.ndarray:
    """[V] bool: True for the ids that end an action."""
    table = np.zeros((vocab_size,), bool)
    for token in stop_token_ids:
        if not 0 <= int(token) < vocab_size:
            raise ValueError(f"stop token id {token} outside the vocabulary [0, {vocab_size})")
        table[int(token)] = True
    return table


def token_ids_containing(tokenizer, strings: Sequence[str], vocab_size: int | None = None):
    """Ids whose decoded text contains any of `strings` (e.g. every token with a newline).

    A stop string split over several tokens is not found this way; use strings that fit in
    one token (the newline default does).
    """
    if not strings:
        return []
    n = len(tokenizer) if vocab_size is None else min(vocab_size, len(tokenizer))
    texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False)
    return [i for i, text in enumerate(texts) if any(s in text for s in strings)]


class Sampler:
    """Prefill + decode with a preallocated KV cache, compiled per shape bucket.

    model: a `Transformer` (its current parameters are read at every call, so a trained
    policy is sampled without rebuilding the sampler). stop_token_ids: ids that end a
    generation (EOS, newline tokens, ...). mesh: optional `jax.sharding.Mesh`; the cache
    batch goes over ('data', 'fsdp') and kv heads over 'tensor' (parameters must already be
    placed with `sharding.shard_params`); batch buckets become multiples of data * fsdp.
    pad_id: id written on padding (never attended to). sample_vocab: only ids below this
    are drawn (default: the model's whole vocabulary; pass len(tokenizer) when the model's
    embedding has padding rows). max_prefill: the most tokens one prefill writes (a longer
    chunk goes in pieces), which bounds a prefill's scratch memory.
    """

    def __init__(self, model, *, stop_token_ids: Sequence[int] = (), mesh=None, pad_id: int = 0,
                 prefill_buckets: Sequence[int] = PREFILL_BUCKETS,
                 cache_buckets: Sequence[int] = CACHE_BUCKETS,
                 batch_buckets: Sequence[int] = BATCH_BUCKETS, sample_vocab: int | None = None,
                 max_prefill: int = MAX_PREFILL):
        self.model = model
        self.config = model.config
        self.mesh = mesh
        self.pad_id = int(pad_id)
        self.prefill_buckets = tuple(prefill_buckets)
        self.cache_buckets = tuple(cache_buckets)
        self.batch_buckets = tuple(batch_buckets)
        if max_prefill < 1:
            raise ValueError(f"max_prefill must be >= 1, got {max_prefill}")
        self.max_prefill = int(max_prefill)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self._stop_table = jnp.asarray(stop_table_for(self.config.vocab_size,
                                                      self.stop_token_ids))
        vocab = self.config.vocab_size
        sample_vocab = vocab if sample_vocab is None else int(sample_vocab)
        if not 0 < sample_vocab <= vocab:
            raise ValueError(f"sample_vocab={sample_vocab} must be in [1, {vocab}] (the "
                             "model's vocabulary)")
        self._allowed = jnp.arange(vocab) < sample_vocab
        self.batch_multiple = 1
        if mesh is not None:
            from jaxrl_agents import sharding

            self.batch_multiple = sharding.batch_shards(mesh)

    # -- shapes and placement

    def batch_size(self, n: int) -> int:
        """The batch bucket for n rows."""
        return bucket(n, self.batch_buckets, self.batch_multiple)

    def _place_cache(self, cache: KVCache, cache_mask):
        if self.mesh is None:
            return cache, cache_mask
        from jaxrl_agents import sharding

        k_sharding, v_sharding = (
            sharding.logical_to_sharding(axes, self.mesh, buf.shape)
            for axes, buf in zip((KEY_AXES, VALUE_AXES), cache))
        mask_sharding = sharding.logical_to_sharding(("batch", "length"), self.mesh,
                                                     cache_mask.shape)
        cache = KVCache(jax.device_put(cache.k, k_sharding), jax.device_put(cache.v, v_sharding))
        return cache, jax.device_put(cache_mask, mask_sharding)

    def _place_rows(self, x):
        if self.mesh is None:
            return jnp.asarray(x)
        from jaxrl_agents import sharding

        return jax.device_put(x, sharding.batch_sharding(self.mesh, np.ndim(x)))

    def new_state(self, batch: int, slots: int = 0) -> DecodeState:
        """An empty cache for `batch` rows (already a batch bucket) and `slots` slots."""
        slots = bucket(max(slots, 1), self.cache_buckets)
        cache = self.model.init_cache(batch, slots)
        mask = jnp.zeros((batch, slots), bool)
        cache, mask = self._place_cache(cache, mask)
        return DecodeState(cache, mask, 0, np.zeros((batch,), np.int32))

    def ensure_room(self, state: DecodeState, needed: int) -> DecodeState:
        """A state with at least `needed` free slots after its cache index: compacts the
        holes away first, then grows the cache to a larger bucket if still short."""
        if state.cache_index + needed <= state.slots:
            return state
        cache, mask, used = _compact(state.cache, state.cache_mask)
        state = state._replace(cache=cache, cache_mask=mask, cache_index=int(used))
        if state.cache_index + needed > state.slots:
            slots = bucket(state.cache_index + needed, self.cache_buckets)
            cache, mask = _grow(state.cache, state.cache_mask, slots=slots)
            cache, mask = self._place_cache(cache, mask)
            state = state._replace(cache=cache, cache_mask=mask)
        return state

    # -- calls

    def extend(self, state: DecodeState, chunks: Sequence[Sequence[int]], max_new: int,
               sampling: SamplingParams, key, choices=None,
               choice_width: int = DEFAULT_CHOICE_WIDTH,
               capture: int = 0) -> tuple[DecodeState, ChunkOutput]:
        """Appends `chunks[b]` to row b and samples up to `max_new` tokens after it.

        chunks: one token list per row of the state (an empty list: the row sits this call
        out and samples nothing). choices: optional, per row a list of commands as token
        ids (None or [] for a free row): constrained decoding (see `data.choices`), the raw
        log-probs are then those of the constrained distribution. Returns the new state and
        the sampled tokens. capture: n > 0 also returns, per row, the ids fed to the model
        and their residual stream after its first n layers (`ChunkOutput`): the output of a
        learner's n frozen layers over these tokens, which it then need not compute again.

        Greedy play by command (`SamplingParams.greedy_by_command`, every row with a chunk
        offered commands) decodes nothing: the tree of commands scored after the chunk
        already gives each row's command and its token log-probs, so the command is returned
        at once and written to the cache ahead of the row's next chunk
        (`DecodeState.unwritten`), which saves its decode steps (a read of every weight
        each). The cache then holds what decoding would have written, in the same order.
        """
        if len(chunks) != state.batch:
            raise ValueError(f"extend(): {len(chunks)} chunks for a state of {state.batch} rows")
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new}")
        if not 0 <= capture < self.config.num_layers:
            raise ValueError(f"capture={capture}: must be 0 (off) or below the model's "
                             f"{self.config.num_layers} layers")
        if key is None:
            key = jax.random.key(0)
        chunks, state = _take_unwritten(chunks, state)
        # A long chunk is prefilled in pieces of at most `max_prefill` tokens (its head
        # first, without decoding), so a prefill's scratch memory (attention scores
        # [B, N, P, S]) stays bounded whatever the prompt's length.
        m = self.max_prefill
        heads = [list(c[:-m]) if len(c) > m else [] for c in chunks]
        pieces = []
        for start in range(0, max(len(h) for h in heads), m):
            state, out = self._run(state, [h[start:start + m] for h in heads], 0, sampling, key,
                                   capture=capture)
            pieces.append(out)
        state, out = self._run(state, [list(c[-m:]) for c in chunks], max_new, sampling, key,
                               choices, choice_width, capture)
        if capture and pieces:  # the heads' tokens were fed first
            pieces.append(out)
            out = out._replace(
                fed=[np.concatenate(rows) for rows in zip(*(p.fed for p in pieces))],
                fed_hidden=[np.concatenate(rows) for rows in zip(*(p.fed_hidden
                                                                   for p in pieces))])
        return state, out

    def _run(self, state: DecodeState, chunks, max_new: int, sampling: SamplingParams, key,
             choices=None, choice_width: int = DEFAULT_CHOICE_WIDTH, capture: int = 0):
        """One `_extend` call: prefill `chunks` (at most `max_prefill` tokens each), then
        decode up to `max_new` tokens (0: prefill only)."""
        longest = max((len(c) for c in chunks), default=0)
        p = bucket(max(longest, 1), self.prefill_buckets)
        ids = np.full((state.batch, p), self.pad_id, np.int32)
        mask = np.zeros((state.batch, p), bool)
        for row, chunk in enumerate(chunks):
            if len(chunk):
                ids[row, p - len(chunk):] = chunk
                mask[row, p - len(chunk):] = True
        width = bucket(max(int(max_new), 1), DECODE_BUCKETS)
        by_command = (sampling.greedy and sampling.greedy_by_command and max_new > 0
                      and bool(choices) and any(choices))
        # Every row that plays has commands: they are played without decoding.
        later = by_command and all(choices[row] for row, c in enumerate(chunks) if len(c))
        state = self.ensure_room(state, p + (0 if later else width))
        graphdef, params = nnx.split(self.model)
        choice_ids = self._choice_array(choices, state.batch, max_new, width)
        tree, full_vocab = None, False
        if by_command:
            tree, full_vocab = self._command_tree(choices, choice_ids.shape[1], max_new,
                                                  int(choice_width))
        (toks, lp_raw, lp_samp, counts, cache, cache_mask, lengths, steps, chunk_hidden,
         decoded_hidden) = _extend(
            graphdef, params, state.cache, state.cache_mask, jnp.int32(state.cache_index),
            self._place_rows(ids), self._place_rows(mask), self._place_rows(state.lengths),
            key, self._stop_table, self._allowed, choice_ids, jnp.int32(max_new), tree,
            width=width, sampling=sampling, choice_width=int(choice_width),
            full_vocab=full_vocab, decode=not later, capture=capture)
        toks, lp_raw, lp_samp, counts, lengths, steps = jax.device_get(
            (toks, lp_raw, lp_samp, counts, lengths, steps))
        fed = fed_hidden = None
        if capture:
            fed, fed_hidden = _fed_rows(chunks, toks, counts, *jax.device_get(
                (chunk_hidden, decoded_hidden)), decoded=not later)
        unwritten = state.unwritten
        if later:
            kept = unwritten or ((),) * state.batch
            unwritten = tuple(tuple(int(t) for t in toks[row, :counts[row]]) if len(chunk)
                              else kept[row] for row, chunk in enumerate(chunks))
        new_state = DecodeState(cache, cache_mask, state.cache_index + p + int(steps),
                                np.asarray(lengths, np.int32), unwritten)
        return new_state, ChunkOutput(toks[:, :max_new], lp_raw[:, :max_new],
                                      lp_samp[:, :max_new], np.asarray(counts), fed,
                                      fed_hidden)

    def _choice_array(self, choices, batch: int, max_new: int, width: int):
        """[B, C, width] int32 of the rows' commands (at most `max_new` tokens each, -1
        padded), placed like the rows; None when no row has any."""
        if not choices or not any(choices):
            return None
        if len(choices) != batch:
            raise ValueError(f"extend(): {len(choices)} choice lists for {batch} rows")
        offered = bucket(max(len(c or ()) for c in choices), CHOICE_BUCKETS)
        out = np.full((batch, offered, width), -1, np.int32)
        for row, commands in enumerate(choices):
            for k, ids in enumerate(commands or ()):
                ids = list(ids)[:max_new]
                out[row, k, :len(ids)] = ids
        return self._place_rows(out)

    def _command_tree(self, choices, offered: int, max_new: int, choice_width: int
                      ) -> tuple[CommandTree, bool]:
        """The rows' commands (cut to `max_new` tokens, as in `_choice_array`) as one padded
        `CommandTree` with `offered` leaf columns, and whether some prefix has more than
        `choice_width` children (a step constrained decoding leaves free)."""
        trees = [command_tree([list(c)[:max_new] for c in (commands or ())])
                 for commands in choices]
        n = bucket(max(max(len(t[0]) for t in trees), 1), TREE_BUCKETS)
        b = len(choices)
        tokens, parents = np.zeros((b, n), np.int32), np.full((b, n), -1, np.int32)
        depths, seen = np.zeros((b, n), np.int32), np.zeros((b, n, n), bool)
        leaves = np.full((b, offered), -1, np.int32)
        wide = False
        for row, (toks, pars, ends) in enumerate(trees):
            tokens[row, :len(toks)], parents[row, :len(pars)] = toks, pars
            leaves[row, :len(ends)] = ends
            for i, parent in enumerate(pars):  # parents come first: their rows are done
                depths[row, i] = 1 + (depths[row, parent] if parent >= 0 else 0)
                if parent >= 0:
                    seen[row, i] = seen[row, parent]
                seen[row, i, i] = True
            children = np.bincount(np.asarray(pars, np.int64) + 1, minlength=1)
            wide = wide or bool((children > choice_width).any())
        tree = CommandTree(*(self._place_rows(x) for x in (tokens, parents, depths, seen, leaves)))
        return tree, wide

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 sampling: SamplingParams = SamplingParams(), key=None) -> GenerationResult:
        """Samples a continuation of every prompt (all in one batch, one device call)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate() needs a non-empty list of non-empty prompts")
        vocab = self.config.vocab_size
        bad = [t for p in prompts for t in p if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        batch = self.batch_size(len(prompts))
        chunks = list(prompts) + [[]] * (batch - len(prompts))
        longest = bucket(max(len(p) for p in prompts), self.prefill_buckets)
        state = self.new_state(batch, longest + bucket(max_new_tokens, DECODE_BUCKETS))
        _, out = self.extend(state, chunks, max_new_tokens, sampling, key)
        result = GenerationResult([], [], [])
        for row in range(len(prompts)):
            n = int(out.num_tokens[row])
            result.tokens.append([int(t) for t in out.tokens[row, :n]])
            result.logprobs.append([float(x) for x in out.logprobs[row, :n]])
            result.sampling_logprobs.append([float(x) for x in out.sampling_logprobs[row, :n]])
        return result


def generate(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
             stop_token_ids: Sequence[int] = (), key=None, mesh=None) -> GenerationResult:
    """Continue every prompt by up to `max_new_tokens` tokens.

    Greedy at temperature 0, else sampled (with top-k / top-p) from `key` (a
    `jax.random.key`; default key 0). A row stops after emitting one of `stop_token_ids`
    (which is kept as its last token). Log-probs are those of the raw policy; the result's
    `sampling_logprobs` are those of the distribution sampled from.
    """
    sampler = Sampler(model, stop_token_ids=stop_token_ids, mesh=mesh)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    return sampler.generate(prompts, max_new_tokens, sampling, key)
