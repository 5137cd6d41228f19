"""Constrained decoding over a turn's offered commands ("choices"), the host-side rule.

When the driver constrains actions, the token sampled at step i of a turn is drawn only from
the ids that continue some offered command (as token ids) agreeing with the tokens sampled
so far. A step with no such id, or with more than `width` distinct ones, is not constrained
(the whole vocabulary). The sampler applies this rule on device while it samples; packing
rebuilds the same per-token lists from the recorded choices, so the learner recomputes
log-probs under the distribution the tokens were actually drawn from.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxrl_agents.data.trajectory import ACTION, Trajectory


def allowed_ids(choices: Sequence[Sequence[int]], action: Sequence[int], width: int
                ) -> list[list[int]]:
    """For every token of `action`: the sorted distinct ids it could have been drawn from
    ([] where the step was not constrained)."""
    alive = [list(c) for c in choices]
    out = []
    for i, token in enumerate(action):
        ids = sorted({c[i] for c in alive if len(c) > i})
        out.append(ids if len(ids) <= width else [])
        alive = [c for c in alive if len(c) > i and c[i] == token]
    return out


def action_runs(token_type: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of every run of action tokens, in order (one per turn)."""
    is_action = np.concatenate([[False], np.asarray(token_type) == ACTION, [False]])
    edges = np.flatnonzero(is_action[1:] != is_action[:-1])
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def allowed_array(traj: Trajectory, length: int, width: int) -> np.ndarray:
    """[length, width] int32: per token the ids it was restricted to, -1 padded; rows of
    -1 for tokens that were not constrained (prompt tokens, turns without choices)."""
    out = np.full((length, width), -1, np.int32)
    choices = traj.info.get("choices") or []
    for turn, (start, end) in enumerate(action_runs(traj.token_type)):
        if turn >= len(choices) or not choices[turn]:
            continue
        for t, ids in enumerate(allowed_ids(choices[turn], traj.tokens[start:end], width)):
            out[start + t, :len(ids)] = ids
    return out


def command_tree(commands: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int]]:
    """The offered commands as a token tree (a trie), for scoring them all in one pass.

    Returns (tokens, parents, leaves): node i is the prefix that ends with token
    `tokens[i]`, its parent the node of the prefix one token shorter (`parents[i]`; -1
    for a first token), nodes in an order where every parent comes before its children;
    `leaves[c]` is the node of command c's last token (-1 for an empty command). Commands
    sharing a prefix share its nodes, so a node's children are exactly the ids constrained
    decoding allows after that prefix.
    """
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, ...], int] = {}
    leaves = []
    for command in commands:
        node = -1
        for depth in range(len(command)):
            prefix = tuple(command[:depth + 1])
            if prefix not in index:
                index[prefix] = len(tokens)
                tokens.append(int(command[depth]))
                parents.append(node)
            node = index[prefix]
        leaves.append(node)
    return tokens, parents, leaves
