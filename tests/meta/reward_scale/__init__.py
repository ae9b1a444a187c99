"""A feature with two settings, the reward scale, written as `docs/adding-a-feature.md` says a feature of the package
is, for `tests/meta/test_architecture.py`, which adds this folder to a copy of the package (and uses it from outside
the package, as a user's feature):

    `config`          its settings, `reward_scale` and `reward_scale_from_step` (`RewardScaleFields`), its part of
                      `GRPOConfig`
    `feature`         `RewardScale`, its trainer wiring: the advantages scaled from a step on
    `reward-scale.md` its docs page
"""
