"""The estimator table (jaxrl_agents/estimators.py)."""


def test_every_estimator_of_the_table_has_its_kernel_and_is_a_config_choice():
    from jaxrl_agents.config import CHOICES
    from jaxrl_agents.estimators import ESTIMATORS, kernel

    assert tuple(ESTIMATORS) == CHOICES["algo.estimator"]
    for name in ESTIMATORS:
        assert callable(kernel(name)), name
