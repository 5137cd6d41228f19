"""envs.make: dispatch by family and clear errors."""

import pytest

import envs
from envs.toy_env import ToyEnv


def test_make_dispatches_on_family():
    env = envs.make({"family": "toy", "task": "guess", "n": 4, "seed": 2})
    assert isinstance(env, ToyEnv) and isinstance(env, envs.Env)
    assert env.task.family == "toy" and env.task.complexity == {"task": "guess", "n": 4}


def test_make_does_not_change_the_spec():
    spec = {"family": "toy", "n": 2}
    envs.make(spec)
    assert spec == {"family": "toy", "n": 2}


def test_unknown_family_names_it_and_the_known_ones():
    with pytest.raises(envs.SpecError) as error:
        envs.make({"family": "chess", "seed": 1})
    assert "'chess'" in str(error.value)
    for family in ("textworld", "alfworld", "code", "toy"):
        assert family in str(error.value)


@pytest.mark.parametrize("spec", [{"seed": 1}, {}, None, "toy", ["family", "toy"]])
def test_missing_family_is_a_spec_error(spec):
    with pytest.raises(envs.SpecError, match="'family'"):
        envs.make(spec)


def test_unknown_key_names_the_key():
    with pytest.raises(envs.SpecError) as error:
        envs.make({"family": "toy", "sed": 1})
    assert "'sed'" in str(error.value) and "seed" in str(error.value)


def test_register_adds_a_family():
    envs.register("toy_again", "envs.toy_env:make_env")
    try:
        assert isinstance(envs.make({"family": "toy_again"}), ToyEnv)
    finally:
        del envs.FAMILIES["toy_again"]


def test_spec_error_is_a_value_error():
    assert issubclass(envs.SpecError, ValueError)
