"""The critic: a scalar value per token, on the policy trunk or on its own copy.

`build_actor_critic(policy, kind, rngs=...)` returns an `ActorCritic` module with
`.policy` (the Transformer) and `.critic` (a `Critic`):

- kind "head": the critic reads the policy's own hidden states (one shared trunk;
  value-loss gradients reach the policy's weights). Keep policy and critic in
  the one `ActorCritic` module so the trunk stays one shared object.
- kind "detached": a head on the policy's hidden states with the gradient stopped there:
  the value loss trains the head only and never moves the policy (so a value warm-up
  leaves the policy exactly as SFT made it).
- kind "separate": the critic's trunk is a copy of the policy, initialised from
  its weights and trained on its own. With the policy's first n layers frozen in RL
  (`rl.frozen_layers`), the copy's first n layers and embedding are the policy's
  (`share_frozen_layers`), so both trunks continue from one computed lower output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_agents.models.transformer import Transformer, lower_part

CRITIC_KINDS = ("head", "detached", "separate")
SHARED_TRUNK_KINDS = ("head", "detached")


class ValueHead(nnx.Module):
    """values[b, t] = hidden[b, t] . w + bias, in float32. w starts at zero."""

    def __init__(self, hidden_size: int, *, rngs: nnx.Rngs | None = None):
        del rngs  # zero init: the first values are 0 whatever the trunk says
        self.weight = nnx.Param(jnp.zeros((hidden_size,), jnp.float32), out_sharding=("embed",),
                                eager_sharding=False)
        self.bias = nnx.Param(jnp.zeros((), jnp.float32), out_sharding=(), eager_sharding=False)

    def __call__(self, hidden_btd):
        """[B, T, D] -> [B, T] float32."""
        h = hidden_btd.astype(jnp.float32)
        return jnp.einsum("btd,d->bt", h, self.weight[...]) + self.bias[...]


class Critic(nnx.Module):
    """`critic(input_ids, positions=None, attention_mask=None) -> values [B, T]`."""

    def __init__(self, trunk: Transformer, head: ValueHead, *, detach: bool = False):
        self.trunk = trunk
        self.head = head
        self.detach = detach

    def __call__(self, input_ids, positions=None, attention_mask=None):
        return self.from_hidden(self.trunk.hidden_states(input_ids, positions, attention_mask))

    def from_hidden(self, hidden_btd):
        """Values [B, T] from the trunk's hidden states [B, T, D]."""
        return self.head(jax.lax.stop_gradient(hidden_btd) if self.detach else hidden_btd)


class ActorCritic(nnx.Module):
    """Policy and critic in one module; `kind` says whether they share the trunk."""

    def __init__(self, policy: Transformer, critic: Critic, kind: str):
        self.policy = policy
        self.critic = critic
        self.kind = kind

    def __call__(self, input_ids, positions=None, attention_mask=None):
        """Policy logits [B, T, V] float32."""
        return self.policy(input_ids, positions, attention_mask)

    def values(self, input_ids, positions=None, attention_mask=None):
        """Critic values [B, T] float32."""
        return self.critic(input_ids, positions, attention_mask)

    def hidden_and_values(self, input_ids, positions=None, attention_mask=None):
        """(the policy's hidden states [B, T, D], values [B, T]); one trunk pass when the
        trunk is shared. `policy.logits(hidden)` gives the logits."""
        hidden = self.policy.hidden_states(input_ids, positions, attention_mask)
        if self.kind in SHARED_TRUNK_KINDS:
            return hidden, self.critic.from_hidden(hidden)
        return hidden, self.critic(input_ids, positions, attention_mask)

    def hidden_and_values_above(self, lower_btd, n: int, positions=None, attention_mask=None):
        """`hidden_and_values` continued from `policy.lower_hidden(.., n)` [B, T, D]: only
        layers n and up run (of both trunks when the critic has its own, whose first n
        layers must equal the policy's: `share_frozen_layers`)."""
        hidden = self.policy.upper_hidden(lower_btd, positions, attention_mask, n)
        return hidden, self.values_above(lower_btd, n, positions, attention_mask, hidden)

    def values_above(self, lower_btd, n: int, positions=None, attention_mask=None,
                     policy_hidden=None):
        """Values [B, T] continued from `policy.lower_hidden(.., n)` [B, T, D]. A shared
        trunk reads the policy's hidden states (`policy_hidden` when already computed); a
        separate critic runs only its own layers n and up."""
        if self.kind in SHARED_TRUNK_KINDS:
            if policy_hidden is None:
                policy_hidden = self.policy.upper_hidden(lower_btd, positions, attention_mask, n)
            return self.critic.from_hidden(policy_hidden)
        return self.critic.from_hidden(
            self.critic.trunk.upper_hidden(lower_btd, positions, attention_mask, n))

    def logits_and_values(self, input_ids, positions=None, attention_mask=None):
        """(logits [B, T, V], values [B, T]); one trunk pass when the trunk is shared."""
        hidden, values = self.hidden_and_values(input_ids, positions, attention_mask)
        return self.policy.logits(hidden), values


def build_actor_critic(policy: Transformer, kind: str, *, rngs: nnx.Rngs | None = None
                       ) -> ActorCritic:
    """Wrap `policy` with a critic of `kind` ("head" | "detached" | "separate")."""
    if kind not in CRITIC_KINDS:
        raise ValueError(f"critic kind {kind!r}; allowed: {list(CRITIC_KINDS)}")
    head = ValueHead(policy.config.hidden_size, rngs=rngs)
    trunk = policy if kind in SHARED_TRUNK_KINDS else nnx.clone(policy)
    return ActorCritic(policy, Critic(trunk, head, detach=kind == "detached"), kind)


def share_frozen_layers(actor_critic: ActorCritic, n: int) -> None:
    """Sets a separate critic's token embedding and first n layers to the policy's, in
    place: the parts `rl.frozen_layers = n` keeps fixed, so the critic continues from the
    policy's `lower_hidden(.., n)` as its own whole pass would. (After SFT the two differ:
    SFT trains the policy only.) A trunk shared with the policy, or n = 0: nothing to do."""
    if actor_critic.kind in SHARED_TRUNK_KINDS or not n:
        return

    def take(path, own, policy):
        part = lower_part(path, n)
        return own if part is None else own.at[part].set(policy[part])

    trunk = actor_critic.critic.trunk
    shared = jax.tree_util.tree_map_with_path(
        take, nnx.state(trunk, nnx.Param), nnx.state(actor_critic.policy, nnx.Param))
    nnx.update(trunk, shared)
