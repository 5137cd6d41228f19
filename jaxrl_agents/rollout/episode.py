"""The multi-turn episode driver: B episodes in lock-step against an `envs.EnvPool`.

Each turn, every live episode's new tokens (the end of its last action turn, the new
observation, the opening of the next action, see `render.Renderer`) are prefilled onto that
episode's KV cache, and actions are sampled for all live episodes in one device call
(`Sampler.extend`); the decoded actions go to the pool, the observations come back.

Overlap: the episodes are split in two half-batches ("lanes") with their own caches. While
the pool steps one lane's actions (`step_async`, then `wait()` in a helper thread that notes
when the results arrived), the model samples the other lane's; so the accelerator works
while environments step and the reverse. `last_stats` reports the fraction of wall time the
model waited for environments (`rollout/model_wait_frac`) and the environments waited for
the model (`rollout/env_wait_frac`: no env call being processed).

An episode ends when its env says done (won / lost / the env's step budget), at the driver's
`max_steps`, when its next turn would pass `max_context` tokens (prompt chunk plus
`max_action_tokens`; recorded as truncated, nothing fed), or when the env fails
(`info["failed"]`, recorded as failed). Tokens are exactly the ids fed and sampled.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

from jaxrl_agents import compile_cache
from jaxrl_agents.data.trajectory import ACTION, PROMPT, Trajectory
from jaxrl_agents.rewards import TURN_INFO_KEYS
from jaxrl_agents.rollout.render import DEFAULT_SYSTEM_PROMPT, Renderer
from jaxrl_agents.rollout.sampler import (
    CACHE_BUCKETS,
    DEFAULT_CHOICE_WIDTH,
    Sampler,
    SamplingParams,
    token_ids_containing,
)

END_REASONS = ("done", "step_budget", "context", "failed", "forced_actions_exhausted")


# ----------------------------------------------------------------------------- one episode


@dataclasses.dataclass
class EpisodeRecord:
    """The growing token record of one episode; `to_trajectory()` freezes it."""

    tokens: list = dataclasses.field(default_factory=list)
    token_type: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    sampling_logprobs: list = dataclasses.field(default_factory=list)
    rewards: list = dataclasses.field(default_factory=list)
    turn_ends: list = dataclasses.field(default_factory=list)
    actions: list = dataclasses.field(default_factory=list)
    turn_info: list = dataclasses.field(default_factory=list)  # reward components per turn
    admissible: list = dataclasses.field(default_factory=list)  # commands offered per state
    choices: list = dataclasses.field(default_factory=list)  # constrained decoding: token ids
    invalid: list = dataclasses.field(default_factory=list)  # env's info["invalid"] per action
    # With `EpisodeDriver.run(capture=n)`: the ids fed to the model, in the order fed, and
    # their residual stream after its first n layers (arrays of [F] and [F, D] per call).
    fed: list = dataclasses.field(default_factory=list)
    fed_hidden: list = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add_prompt(self, ids: Sequence[int]) -> None:
        n = len(ids)
        self.tokens += [int(t) for t in ids]
        self.token_type += [PROMPT] * n
        self.logprobs += [0.0] * n
        self.sampling_logprobs += [0.0] * n
        self.rewards += [0.0] * n

    def add_action(self, ids: Sequence[int], text: str, logprobs=None, sampling_logprobs=None):
        n = len(ids)
        if n == 0:
            raise ValueError("an action needs at least one token")
        self.tokens += [int(t) for t in ids]
        self.token_type += [ACTION] * n
        self.logprobs += [0.0] * n if logprobs is None else [float(x) for x in logprobs]
        self.sampling_logprobs += ([0.0] * n if sampling_logprobs is None
                                   else [float(x) for x in sampling_logprobs])
        self.rewards += [0.0] * n
        self.turn_ends.append(len(self.tokens) - 1)
        self.actions.append(text)

    def add_reward(self, reward: float, info: dict | None = None) -> None:
        """The reward of the last action, on its last token; the env's reward-component
        info keys (rewards.TURN_INFO_KEYS) are kept for that turn, and its verdict
        `info["invalid"]` (the action was not among the commands the env accepts)."""
        self.rewards[self.turn_ends[-1]] += float(reward)
        self.invalid.append(bool((info or {}).get("invalid", False)))
        self.turn_info += [{}] * (len(self.turn_ends) - len(self.turn_info))
        self.turn_info[-1].update({k: info[k] for k in TURN_INFO_KEYS if k in (info or {})})

    def to_trajectory(self, **fields) -> Trajectory:
        info = fields.pop("info", {})
        info = {"actions": list(self.actions),
                "sampling_logprobs": np.asarray(self.sampling_logprobs, np.float32),
                "turn_info": [dict(d) for d in self.turn_info],
                "admissible": [list(c) for c in self.admissible[:len(self.actions)]],
                "invalid": list(self.invalid), **info}
        if self.choices:
            info["choices"] = [[list(ids) for ids in turn] for turn in self.choices]
        return Trajectory(tokens=self.tokens, token_type=self.token_type,
                          logprobs=self.logprobs, rewards=self.rewards,
                          turn_ends=list(self.turn_ends), info=info,
                          lower_hidden=self.captured_hidden(), **fields)

    def captured_hidden(self):
        """[L, D] the captured hidden states of every token, when the ids fed are exactly
        the record's tokens (a record that ends with tokens never fed, such as a final
        observation or a command played but not yet written, has none); else None."""
        if not self.fed_hidden:
            return None
        fed = np.concatenate(self.fed)
        if len(fed) != len(self.tokens) or not np.array_equal(fed, self.tokens):
            return None
        return np.concatenate(self.fed_hidden)


def render_gold_trajectory(renderer: Renderer, observations: Sequence[str],
                           actions: Sequence[str], rewards: Sequence[float] | None = None, *,
                           won: bool = True, task_id: str = "", group_id: int = 0) -> Trajectory:
    """A trajectory of given texts rendered exactly like an RL episode (for SFT data).

    observations[0] is the reset observation, observations[k] the one after actions[k-1];
    at least len(actions) of them (an observation after the last action is not rendered).
    rewards[k] sits on the last token of actions[k]. Log-probs are 0.
    """
    if len(observations) < len(actions) or not observations:
        raise ValueError(f"render_gold_trajectory: {len(observations)} observations for "
                         f"{len(actions)} actions (need one before every action)")
    rewards = [0.0] * len(actions) if rewards is None else list(rewards)
    if len(rewards) != len(actions):
        raise ValueError(f"{len(rewards)} rewards for {len(actions)} actions")
    record = EpisodeRecord()
    record.add_prompt(renderer.first_chunk(observations[0]))
    for k, action in enumerate(actions):
        if k:
            record.add_prompt(renderer.next_chunk(observations[k], record.tokens[-1:]))
        record.add_action(renderer.action_ids(action), action)
        record.add_reward(rewards[k])
    return record.to_trajectory(won=won, task_id=task_id, group_id=group_id)


@dataclasses.dataclass
class _Episode:
    """Driver-side state of one live episode."""

    env_id: int
    group_id: int
    record: EpisodeRecord = dataclasses.field(default_factory=EpisodeRecord)
    task_id: str = ""
    pending: list = dataclasses.field(default_factory=list)  # ids to feed before the action
    steps: int = 0
    done: bool = False
    won: bool = False
    truncated: bool = False
    failed: bool = False
    end_reason: str = ""
    error: str = ""
    forced: list | None = None
    random_rng: np.random.Generator | None = None  # forced_actions="random": picks commands
    max_steps: int | None = None  # this episode's step budget (None: the driver's)

    def end(self, reason: str, *, truncated=False, failed=False, won=False) -> None:
        self.done, self.end_reason = True, reason
        self.truncated, self.failed, self.won = truncated, failed, won

    def forced_action(self) -> str:
        """The next forced action: from the forced list, or a random offered command."""
        if self.random_rng is None:
            return self.forced[self.steps]
        offered = self.record.admissible[-1] if self.record.admissible else []
        return str(offered[self.random_rng.integers(len(offered))]) if offered else "look"

    def forced_exhausted(self) -> bool:
        return self.random_rng is None and self.steps >= len(self.forced)

    def trajectory(self) -> Trajectory:
        info = {"env_id": self.env_id, "steps": self.steps, "end_reason": self.end_reason}
        if self.error:
            info["error"] = self.error
        return self.record.to_trajectory(won=self.won, truncated=self.truncated,
                                         failed=self.failed, task_id=self.task_id,
                                         group_id=self.group_id, info=info)


class _Lane:
    """A half-batch of episodes with its own KV cache."""

    def __init__(self, episodes: list[_Episode], sampler: Sampler | None):
        self.episodes = episodes
        self.state = None
        if sampler is not None:
            self.state = sampler.new_state(sampler.batch_size(len(episodes)))

    @property
    def live(self) -> bool:
        return any(not ep.done for ep in self.episodes)


@dataclasses.dataclass
class _Timer:
    """Wall-time bookkeeping of one run (seconds)."""

    start: float = dataclasses.field(default_factory=time.perf_counter)
    model: float = 0.0
    env_wait: float = 0.0  # the model side blocked waiting for env results (and resets)
    env_busy: float = 0.0  # an env call was being processed (submit to results)
    submitted: float = 0.0


# ----------------------------------------------------------------------------- the driver


class EpisodeDriver:
    """Plays episodes of `pool` with `model`, records one `Trajectory` each.

    model: the policy `Transformer`. tokenizer: its Hugging Face tokenizer. pool: an
    `envs.EnvPool`. max_action_tokens: an action is cut after this many tokens.
    max_context: an episode is truncated before a turn whose prompt chunk plus
    `max_action_tokens` would pass this. temperature / top_p / top_k: sampling (temperature
    0 = greedy). stop_strings: an action ends after a token whose text contains one (and at
    EOS). template: "chat" (the tokenizer's chat template) | "plain". system_prompt: first
    message. group_size: consecutive env ids in groups of this size play the same task and
    share a group id. max_steps: the driver's own step budget (None: the envs' budgets).
    overlap: split the batch in two half-batches that alternate with the envs.
    constrain_actions: sample each action only among the commands the env offers
        (`admissible_commands`), token by token (see `data.choices`); an offered command
        longer than `max_action_tokens` is not cut. The turn's commands are recorded
        in `info["choices"]` (forced actions too) so the learner recomputes
        log-probs under the same restriction. choice_width: a step with more distinct
        candidate tokens than this is not restricted. greedy_by: how greedy play picks a
        constrained action: "command" (the offered command of highest total log-probability)
        or "token" (the argmax token at each step).
    final_observation: an episode cut short (step budget, context, the env's own budget)
        ends its record with the observation that followed its last action, as prompt
        tokens, when it fits the context: the learner's critic then values the state the
        episode was cut in (`algo.bootstrap_truncated`). Off: the record ends at the action.
    mesh: optional mesh for the sampler's cache (parameters already sharded).
    cache_buckets: KV cache lengths compiled for (the cache grows through them).
    """

    def __init__(self, model, tokenizer, pool, *, max_action_tokens: int = 16,
                 max_context: int = 1024, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, stop_strings: Sequence[str] = ("\n",),
                 template: str = "chat", system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 group_size: int = 1, max_steps: int | None = None, overlap: bool = True,
                 mesh=None, cache_buckets: Sequence[int] = CACHE_BUCKETS,
                 constrain_actions: bool = False, choice_width: int = DEFAULT_CHOICE_WIDTH,
                 greedy_by: str = "command", final_observation: bool = False):
        if max_action_tokens < 1:
            raise ValueError(f"max_action_tokens must be >= 1, got {max_action_tokens}")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.model, self.tokenizer, self.pool = model, tokenizer, pool
        self.max_action_tokens = int(max_action_tokens)
        self.max_context = int(max_context)
        if greedy_by not in ("command", "token"):
            raise ValueError(f"greedy_by must be 'command' or 'token', got {greedy_by!r}")
        self.greedy = SamplingParams(greedy_by_command=greedy_by == "command")
        self.sampling = dataclasses.replace(self.greedy, temperature=float(temperature),
                                            top_k=int(top_k), top_p=float(top_p))
        self.renderer = Renderer(tokenizer, template, system_prompt, tuple(stop_strings))
        self.group_size = int(group_size)
        self.max_steps = max_steps
        self.overlap = overlap
        self.constrain_actions = bool(constrain_actions)
        self.choice_width = int(choice_width)
        self.final_observation = bool(final_observation)
        self._command_ids: dict[str, list[int]] = {}
        stops = token_ids_containing(tokenizer, tuple(stop_strings), model.config.vocab_size)
        if tokenizer.eos_token_id is not None:
            stops.append(int(tokenizer.eos_token_id))
        self.sampler = Sampler(model, stop_token_ids=sorted(set(stops)), mesh=mesh,
                               pad_id=tokenizer.pad_token_id or 0, cache_buckets=cache_buckets,
                               sample_vocab=min(len(tokenizer), model.config.vocab_size))
        self.last_stats: dict[str, float] = {}
        self._groups_used = 0
        self._calls = 0
        self._capture = 0  # `run(capture=n)`: the layers whose output the run keeps

    @classmethod
    def from_config(cls, model, tokenizer, pool, config, **overrides) -> EpisodeDriver:
        """From the `rollout` and `tokenizer` sections of a config (configs/base.py)."""
        r = config.rollout
        kwargs = dict(max_action_tokens=r.max_action_tokens, max_context=r.max_context,
                      temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                      stop_strings=tuple(r.stop_strings), group_size=r.group_size,
                      template=config.tokenizer.chat_template,
                      system_prompt=config.tokenizer.system_prompt or DEFAULT_SYSTEM_PROMPT,
                      cache_buckets=tuple(r.length_buckets),
                      constrain_actions=r.constrain_actions, choice_width=r.choice_width,
                      greedy_by=r.greedy_by, final_observation=config.algo.bootstrap_truncated)
        kwargs.update(overrides)
        return cls(model, tokenizer, pool, **kwargs)

    # -- public

    def run(self, env_ids: Sequence[int], key=None, seeds: Sequence[int] | None = None, *,
            greedy: bool = False, forced_actions: Sequence[Sequence[str]] | str | None = None,
            max_steps: Sequence[int | None] | None = None,
            temperature: float | None = None, capture: int = 0) -> list[Trajectory]:
        """Plays one episode in each env of `env_ids` (reset with `seeds`), in lock-step.

        key: `jax.random.key` for sampling (default key 0). greedy: argmax actions.
        temperature: sample at this temperature (the driver's top-k / top-p kept) instead
        of the driver's own; 0 is greedy.
        forced_actions: play these action strings instead of sampling (one list per env;
        "gold" for each task's gold actions; "random" for a uniformly drawn admissible
        command each turn, seeded by `key`); the rendering is the same, log-probs are 0 and
        the model is not called. An episode whose forced actions run out before done ends
        truncated ("forced_actions_exhausted").
        max_steps: a step budget per env id (None entries: the driver's `max_steps`); an
        episode that reaches its budget ends truncated ("step_budget").
        capture: n > 0 keeps, with each trajectory whose every token was fed to the model,
        their residual stream after its first n layers (`Trajectory.lower_hidden`: the
        output of a learner's n frozen layers, which it then need not run again).
        Returns one Trajectory per env id, in order; `last_stats` gets the run's metrics.
        """
        env_ids = [int(i) for i in env_ids]
        if not env_ids:
            raise ValueError("run() needs at least one env id")
        if len(env_ids) % self.group_size:
            raise ValueError(f"{len(env_ids)} env ids are not a whole number of groups of "
                             f"group_size={self.group_size}")
        compile_cache.release_if_near_limit()
        timer = _Timer()
        self._calls = 0  # sampling keys are fold_in(key, call number): reproducible runs
        self._capture = int(capture)
        episodes = self._reset(env_ids, seeds, timer)
        self._check_groups(episodes)
        if max_steps is not None:
            if len(max_steps) != len(episodes):
                raise ValueError(f"{len(max_steps)} step budgets for {len(episodes)} env ids")
            for ep, budget in zip(episodes, max_steps):
                ep.max_steps = budget
        key = jax.random.key(0) if key is None else key
        if forced_actions is not None:
            self._attach_forced(episodes, forced_actions, key)
        sampling = self.greedy if greedy else self.sampling
        if temperature is not None and not greedy:
            sampling = dataclasses.replace(sampling, temperature=float(temperature))
        forced = forced_actions is not None
        lanes = self._lanes(episodes, forced)
        self._play(lanes, sampling, key, timer, forced)
        self._groups_used += len(env_ids) // self.group_size
        trajectories = [ep.trajectory() for ep in episodes]
        self.last_stats = self._stats(trajectories, timer)
        return trajectories

    @property
    def groups_used(self) -> int:
        """Group ids handed out so far: the next `run` numbers its groups from this one."""
        return self._groups_used

    def number_groups_from(self, first: int) -> None:
        """The next `run`'s first group gets id `first`. A resumed run continues its
        counter; the processes of a multi-host run number their shares apart, so group ids
        stay unique over every process's episodes."""
        self._groups_used = int(first)

    # -- setup

    def _reset(self, env_ids, seeds, timer: _Timer) -> list[_Episode]:
        start = time.perf_counter()
        results = self.pool.reset(env_ids, seeds)
        spent = time.perf_counter() - start
        timer.env_wait += spent
        timer.env_busy += spent
        tasks = self.pool.tasks
        episodes = []
        for k, (env_id, result) in enumerate(zip(env_ids, results)):
            ep = _Episode(env_id=env_id, group_id=self._groups_used + k // self.group_size,
                          task_id=tasks[env_id].name)
            if result.info.get("failed"):
                ep.error = str(result.info.get("error", ""))
                ep.end("failed", failed=True)
            else:
                ep.pending = self.renderer.first_chunk(result.observation)
                ep.record.admissible.append(result.info.get("admissible_commands") or [])
            episodes.append(ep)
        return episodes

    def _check_groups(self, episodes: list[_Episode]) -> None:
        g = self.group_size
        for start in range(0, len(episodes), g):
            names = {ep.task_id for ep in episodes[start:start + g]}
            if len(names) > 1:
                ids = [ep.env_id for ep in episodes[start:start + g]]
                raise ValueError(f"env ids {ids} form one group (group_size={g}) but play "
                                 f"different tasks {sorted(names)}; repeat each spec "
                                 "group_size times in the pool (see grouped_specs)")

    def _attach_forced(self, episodes, forced_actions, key) -> None:
        if forced_actions == "random":
            seed = [int(x) for x in np.asarray(jax.random.key_data(key)).ravel()]
            for ep in episodes:
                ep.random_rng = np.random.default_rng(seed + [ep.env_id])
            return
        if isinstance(forced_actions, str):
            if forced_actions != "gold":
                raise ValueError(f"forced_actions={forced_actions!r}; a list of action lists, "
                                 "'gold' or 'random'")
            tasks = self.pool.tasks
            forced_actions = [tasks[ep.env_id].gold_actions for ep in episodes]
        if len(forced_actions) != len(episodes):
            raise ValueError(f"{len(forced_actions)} forced action lists for "
                             f"{len(episodes)} env ids")
        for ep, actions in zip(episodes, forced_actions):
            ep.forced = list(actions)

    def _lanes(self, episodes, forced: bool) -> list[_Lane]:
        sampler = None if forced else self.sampler
        if not self.overlap or len(episodes) < 2:
            return [_Lane(episodes, sampler)]
        half = (len(episodes) + 1) // 2
        return [_Lane(episodes[:half], sampler), _Lane(episodes[half:], sampler)]

    # -- the loop

    def _play(self, lanes: list[_Lane], sampling, key, timer: _Timer, forced: bool) -> None:
        """Alternates lanes: the model acts for one while the pool steps the other."""
        inflight = None  # (lane, episodes stepped, future of (results, arrival time))
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-wait") as waiter:
            while any(lane.live for lane in lanes) or inflight is not None:
                for lane in lanes:
                    if inflight is not None and inflight[0] is lane:
                        self._finish(inflight, timer)
                        inflight = None
                    stepping = []
                    if lane.live:
                        start = time.perf_counter()
                        stepping = self._act(lane, sampling, key, forced)
                        timer.model += time.perf_counter() - start
                    if inflight is not None:
                        self._finish(inflight, timer)
                        inflight = None
                    if stepping:
                        actions = [ep.record.actions[-1] for ep in stepping]
                        timer.submitted = time.perf_counter()
                        self.pool.step_async([ep.env_id for ep in stepping], actions)
                        inflight = (lane, stepping, waiter.submit(self._wait_pool))

    def _wait_pool(self):
        """Runs in the waiter thread (the only pool user until its future is read)."""
        results = self.pool.wait()
        return results, time.perf_counter()

    def _act(self, lane: _Lane, sampling, key, forced: bool) -> list[_Episode]:
        """Feeds every live episode its pending chunk and picks its next action.

        Returns the episodes that now have an action to send to the pool.
        """
        acting = []
        for ep in lane.episodes:
            if ep.done:
                continue
            budget = self.max_steps if ep.max_steps is None else ep.max_steps
            if budget is not None and ep.steps >= budget:
                self._cut(ep, "step_budget")
                continue
            choices = self._choices_of(ep) if self.constrain_actions else None
            if len(ep.record) + len(ep.pending) + self._action_room(choices) > self.max_context:
                self._cut(ep, "context")
                continue
            if forced and ep.forced_exhausted():
                ep.end("forced_actions_exhausted", truncated=True)
                continue
            acting.append(ep)
            if choices is not None:
                ep.record.choices.append(choices)
        if not acting:
            return []
        for ep in acting:
            ep.record.add_prompt(ep.pending)
        if forced:
            for ep in acting:
                text = ep.forced_action()
                ep.record.add_action(self.renderer.action_ids(text), text)
        else:
            self._sample(lane, acting, sampling, key)
        for ep in acting:
            ep.pending = []
        return acting

    def _cut(self, ep: _Episode, reason: str) -> None:
        """Ends an episode cut short; with `final_observation`, its pending observation (the
        state it was cut in) closes the record when it fits the context."""
        if (self.final_observation and ep.pending and ep.record.turn_ends
                and len(ep.record) + len(ep.pending) <= self.max_context):
            ep.record.add_prompt(ep.pending)
            ep.pending = []
        ep.end(reason, truncated=True)

    def _action_room(self, choices) -> int:
        """Tokens an action may take: `max_action_tokens`, or more when an offered command
        is longer (constrained decoding never cuts a command)."""
        return max([self.max_action_tokens] + [len(c) for c in choices or ()])

    def _choices_of(self, ep: _Episode) -> list[list[int]]:
        """The commands offered in the episode's current state, as action token ids."""
        offered = ep.record.admissible[-1] if ep.record.admissible else []
        out = []
        for command in offered:
            ids = self._command_ids.get(command)
            if ids is None:
                ids = self._command_ids[command] = self.renderer.action_ids(command)
            out.append(ids)
        return out

    def _sample(self, lane: _Lane, acting: list[_Episode], sampling, key) -> None:
        chunks = [[] for _ in range(lane.state.batch)]
        choices = [[] for _ in range(lane.state.batch)] if self.constrain_actions else None
        rows = {id(ep): row for row, ep in enumerate(lane.episodes)}
        for ep in acting:
            chunks[rows[id(ep)]] = ep.pending
            if choices is not None:
                choices[rows[id(ep)]] = ep.record.choices[-1]
        self._calls += 1
        call_key = jax.random.fold_in(key, self._calls)
        room = max(self._action_room(ep.record.choices[-1] if choices is not None else None)
                   for ep in acting)
        lane.state, out = self.sampler.extend(lane.state, chunks, room, sampling, call_key,
                                              choices, self.choice_width, self._capture)
        for ep in acting:
            row = rows[id(ep)]
            n = int(out.num_tokens[row])
            ids = out.tokens[row, :n]
            ep.record.add_action(ids, self.renderer.action_text(ids), out.logprobs[row, :n],
                                 out.sampling_logprobs[row, :n])
            if out.fed is not None:
                ep.record.fed.append(out.fed[row])
                ep.record.fed_hidden.append(out.fed_hidden[row])

    def _finish(self, inflight, timer: _Timer) -> None:
        """Waits for the pool's results and applies them to the episodes just stepped."""
        _, stepped, future = inflight
        start = time.perf_counter()
        results, arrived = future.result()
        timer.env_wait += time.perf_counter() - start
        timer.env_busy += arrived - timer.submitted
        for ep, result in zip(stepped, results):
            ep.steps += 1
            ep.record.add_reward(result.reward, result.info)
            if result.info.get("failed"):
                ep.error = str(result.info.get("error", ""))
                ep.end("failed", failed=True)
            elif result.done and bool(result.info.get("truncated", False)) and not result.won:
                ep.pending = self.renderer.next_chunk(result.observation, ep.record.tokens[-1:])
                self._cut(ep, "done")
            elif result.done:
                ep.end("done", won=bool(result.won))
            else:
                ep.pending = self.renderer.next_chunk(result.observation,
                                                      ep.record.tokens[-1:])
                ep.record.admissible.append(result.info.get("admissible_commands") or [])

    # -- metrics

    @staticmethod
    def _stats(trajectories: list[Trajectory], timer: _Timer) -> dict[str, float]:
        wall = max(time.perf_counter() - timer.start, 1e-9)
        n = len(trajectories)
        reasons = [t.info["end_reason"] for t in trajectories]
        return {
            "rollout/episodes": n,
            "rollout/turns": sum(t.num_turns for t in trajectories),
            "rollout/action_tokens": sum(t.num_action_tokens for t in trajectories),
            "rollout/won_frac": sum(t.won for t in trajectories) / n,
            "rollout/truncated_frac": sum(t.truncated for t in trajectories) / n,
            "rollout/context_truncated_frac": reasons.count("context") / n,
            "rollout/failed_frac": sum(t.failed for t in trajectories) / n,
            "rollout/mean_return": float(np.mean([t.episode_return for t in trajectories])),
            "rollout/wall_s": wall,
            "rollout/model_s": timer.model,
            "rollout/model_wait_frac": timer.env_wait / wall,
            "rollout/env_wait_frac": max(0.0, 1.0 - timer.env_busy / wall),
        }


def grouped_specs(specs: Sequence[dict], group_size: int) -> list[dict]:
    """Each spec repeated `group_size` times in a row: the pool layout `run` expects for
    groups (env ids [g * k, g * (k + 1)) play specs[k])."""
    return [dict(spec) for spec in specs for _ in range(group_size)]
