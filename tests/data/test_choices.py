"""The constrained-decoding rule on the host side: per-token allowed ids from choices."""

import numpy as np

from jaxrl_agents.data import ACTION, PROMPT, Trajectory, pack
from jaxrl_agents.data.choices import action_runs, allowed_array, allowed_ids

STOP = 1
CHOICES = [[20, 21, STOP], [20, 22, 23, STOP], [30, STOP]]


def test_allowed_ids_follow_the_commands_that_agree_so_far():
    assert allowed_ids(CHOICES, [20, 22, 23, STOP], width=8) == [[20, 30], [21, 22], [23],
                                                                  [STOP]]
    assert allowed_ids(CHOICES, [30, STOP], width=8) == [[20, 30], [STOP]]
    # Off the commands (not possible when sampled constrained): free from there on.
    assert allowed_ids(CHOICES, [20, 99, 5], width=8) == [[20, 30], [21, 22], []]
    # More distinct candidates than the width: that step is free, later ones are not.
    assert allowed_ids(CHOICES, [20, 21, STOP], width=1) == [[], [], [STOP]]
    assert allowed_ids([], [4, 5], width=8) == [[], []]


def test_action_runs():
    types = np.array([PROMPT, ACTION, ACTION, PROMPT, PROMPT, ACTION, PROMPT, ACTION])
    assert action_runs(types) == [(1, 3), (5, 6), (7, 8)]
    assert action_runs(np.array([PROMPT, PROMPT])) == []


def _episode(choices_per_turn):
    tokens = [7, 8, 20, 22, 23, STOP, 9, 30, STOP]
    types = [PROMPT, PROMPT, ACTION, ACTION, ACTION, ACTION, PROMPT, ACTION, ACTION]
    info = {} if choices_per_turn is None else {"choices": choices_per_turn}
    return Trajectory(tokens=tokens, token_type=types, logprobs=[0.0] * 9, rewards=[0.0] * 9,
                      turn_ends=[5, 8], info=info)


def test_allowed_array_and_pack():
    traj = _episode([CHOICES, [[30, STOP], [31, STOP]]])
    arr = allowed_array(traj, length=12, width=4)
    assert arr.shape == (12, 4)
    assert (arr[:2] == -1).all() and (arr[6] == -1).all() and (arr[9:] == -1).all()
    assert arr[2].tolist() == [20, 30, -1, -1] and arr[3].tolist() == [21, 22, -1, -1]
    assert arr[5].tolist() == [STOP, -1, -1, -1]
    assert arr[7].tolist() == [30, 31, -1, -1] and arr[8].tolist() == [STOP, -1, -1, -1]
    # A turn without choices is free; an episode without any is free everywhere.
    assert (allowed_array(_episode([CHOICES, []]), 12, 4)[7:] == -1).all()
    batch = pack([traj, _episode(None)], length_buckets=(16,), row_multiple=4, choice_width=4)
    assert batch.allowed.shape == (4, 16, 4)
    np.testing.assert_array_equal(batch.allowed[0, :12], arr)
    assert (batch.allowed[1:] == -1).all()
    assert "allowed" in batch.as_dict() and batch.rows([0, 1]).allowed.shape == (2, 16, 4)
    plain = pack([traj], length_buckets=(16,))
    assert plain.allowed is None and "allowed" not in plain.as_dict()


def test_command_tree_shares_prefixes_and_lists_children_as_allowed_ids():
    from jaxrl_agents.data.choices import allowed_ids, command_tree

    commands = [[5, 7, 2], [5, 8, 2], [6, 10, 2], [5, 7, 9, 2]]
    tokens, parents, leaves = command_tree(commands)
    assert len(tokens) == 10  # 5, 57, 572, 58, 582, 6, 6-10, 6-10-2, 579, 5792: 13 tokens, 10 nodes
    for c, command in enumerate(commands):  # walking up from a leaf spells the command
        path, node = [], leaves[c]
        while node >= 0:
            path.append(tokens[node])
            node = parents[node]
        assert path[::-1] == command
        for depth, ids in enumerate(allowed_ids(commands, command, width=64)):
            node = -1 if depth == 0 else _node_of(tokens, parents, command[:depth])
            assert sorted(tokens[i] for i, p in enumerate(parents) if p == node) == ids
    assert all(p < i for i, p in enumerate(parents))


def _node_of(tokens, parents, prefix):
    node = -1
    for token in prefix:
        node = next(i for i, p in enumerate(parents) if p == node and tokens[i] == token)
    return node
