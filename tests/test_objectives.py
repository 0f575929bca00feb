"""zppo_trl/objectives.py and the settings that pick Step 6's objective (sec:appendix:backbones): which registered loss
a configuration trains with, and the ZPPOConfig fields that select and parametrize it.

``ZPPOConfig.policy_objective`` picks the objective: "grpo" (the paper's), "gspo", "cispo" and "dispo" (their losses
are zppo_trl.losses', checked in tests/test_losses.py), and the rows registered by the modules of
``OBJECTIVE_MODULES`` (tests/test_hybrid_objectives.py, tests/test_self_teachers.py). Here: ``loss_for`` answers with
the whole registry; each objective sets the TRL settings it needs and nothing else; bad values name their field; the
variant is named as the paper prints it; and the command line reaches it all.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from trl import TrlParser

from zppo_trl import ZPPOConfig
from zppo_trl.augmentations import CorrectionTargets
from zppo_trl.config import PAPER_OBJECTIVE
from zppo_trl.distill import OffDistill, OnDistill
from zppo_trl.losses import LOSSES
from zppo_trl.objectives import loss_for

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from loss_fixtures import ARGS, CPU
except ImportError:
    from tests.loss_fixtures import ARGS, CPU


# --------------------------------------------------------------------------- which loss a configuration trains with


def test_registry_names_and_selection():
    assert set(LOSSES) >= {"dapo", "gspo", "cispo", "dispo", "sft", "jsd"}
    assert loss_for(ARGS).name == "dapo"
    assert loss_for(SimpleNamespace(**{**vars(ARGS), "policy_objective": "gspo"})).name == "gspo"
    assert loss_for(SimpleNamespace(**{**vars(ARGS), "policy_objective": "dispo"})).name == "dispo"
    # a row that fits targets trains the loss its step-5 part names (zppo_trl.augmentations.Source.loss)
    assert loss_for(ARGS, CorrectionTargets.loss).name == "sft" and loss_for(ARGS, OnDistill.loss).name == "jsd"
    assert loss_for(ARGS, OffDistill.loss).name == "jsd"
    assert LOSSES["jsd"].computes == "distributions" and LOSSES["dapo"].computes == "logps"


# --------------------------------------------------------------------------- the configuration


def test_each_objective_sets_what_it_needs_and_nothing_else():
    base = ZPPOConfig(**CPU)
    expected = {
        "grpo": {},
        "gspo": {"importance_sampling_level": "sequence"},
        "cispo": {"loss_type": "cispo"},
        "dispo": {},
    }
    for objective, changes in expected.items():
        c = ZPPOConfig(**CPU, policy_objective=objective)
        for name, (required, _why) in PAPER_OBJECTIVE.items():
            assert getattr(c, name) == changes.get(name, required), (objective, name)
        # every other setting follows the paper's table
        assert (c.epsilon, c.epsilon_high, c.delta, c.beta, c.learning_rate) == (
            base.epsilon,
            base.epsilon_high,
            base.delta,
            base.beta,
            base.learning_rate,
        )
        # a configuration of this objective, saved with the TRL values it set, loads again
        assert ZPPOConfig(**CPU, policy_objective=objective, **changes).policy_objective == objective


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(policy_objective="ppo"), "policy_objective"),
        (dict(policy_objective="GSPO"), "policy_objective"),
        (dict(policy_objective="dispo", dispo_epsilon_low_pos=-0.1), "dispo_epsilon_low_pos"),
        (dict(policy_objective="dispo", dispo_epsilon_high_pos=float("inf")), "dispo_epsilon_high_pos"),
        (dict(dispo_epsilon_low_neg="1"), "dispo_epsilon_low_neg"),
        (dict(dispo_epsilon_high_neg=-5.0), "dispo_epsilon_high_neg"),
        (dict(policy_objective="gspo", delta=None), "delta"),
        (dict(policy_objective="gspo", delta=1.2), "delta"),
        (dict(policy_objective="gspo", gspo_settings="table"), "gspo_settings"),
        (dict(policy_objective="cispo", cispo_weight_bound=0.28), "cispo_weight_bound"),
        (dict(policy_objective="cispo", cispo_weight_bound=float("inf")), "cispo_weight_bound"),
        (dict(policy_objective="dispo", dispo_out_of_bounds="mask"), "dispo_out_of_bounds"),
    ],
)
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"^{field}"):
        ZPPOConfig(**CPU, **overrides)


@pytest.mark.parametrize(
    "name, value, objective",
    [("loss_type", "cispo", "cispo"), ("importance_sampling_level", "sequence", "gspo"), ("loss_type", "grpo", None)],
)
def test_trl_settings_set_directly_are_refused_and_point_to_policy_objective(name, value, objective):
    with pytest.raises(ValueError, match=rf"^{name}=.* changes ZPPO's objective.*Set {name}=") as err:
        ZPPOConfig(**CPU, **{name: value})
    assert (f"policy_objective='{objective}'" in str(err.value)) == (objective is not None)
    # and an objective does not license another objective's setting
    with pytest.raises(ValueError, match=rf"^{name}="):
        ZPPOConfig(**CPU, policy_objective="dispo", **{name: value})


def test_the_dual_clip_is_checked_only_where_it_acts():
    for objective in ("cispo", "dispo"):  # they bound the importance weight themselves
        assert ZPPOConfig(**CPU, policy_objective=objective, delta=None).delta is None


@pytest.mark.parametrize(
    "reformulations, replay_fraction, objective, variant",
    [
        (["bcq", "ncq"], 0.25, "grpo", "ZPPO"),
        ([], 0.25, "grpo", "GRPO\u2020"),
        (["bcq", "ncq"], 0.25, "gspo", "ZPPO (GSPO)"),
        (["bcq", "ncq"], 0.25, "cispo", "ZPPO (CISPO)"),
        (["bcq", "ncq"], 0.25, "dispo", "ZPPO (DISPO)"),
        ([], 0.25, "gspo", "GSPO\u2020"),
        ([], 0.25, "cispo", "CISPO\u2020"),
        ([], 0.25, "dispo", "DISPO\u2020"),
        ([], 0.0, "dispo", "DISPO"),  # the objective alone, without the buffer (as GRPO is to GRPO†)
        (["bcq"], 0.25, "cispo", "GRPO\u2020+BCQ (CISPO)"),
        (["bcq", "ncq"], 0.0, "gspo", "GRPO+Both (GSPO)"),
    ],
)
def test_variant_names_the_objective_as_the_paper_does(reformulations, replay_fraction, objective, variant):
    teacher = dict(teacher_base_url="http://127.0.0.1:8000/v1", teacher_model="t") if reformulations else {}
    c = ZPPOConfig(
        **{**CPU, "augmentations": reformulations},
        **teacher,
        replay_fraction=replay_fraction,
        policy_objective=objective,
    )
    assert c.variant == variant


def test_command_line():
    args = [
        "--output_dir",
        "unused",
        "--use_cpu",
        "--bf16",
        "false",
        "--augmentations",
        "",
        "--policy_objective",
        "dispo",
        "--dispo_epsilon_high_neg",
        "50",
    ]
    (config,) = TrlParser((ZPPOConfig,)).parse_args_and_config(args)
    assert (
        config.policy_objective == "dispo" and config.dispo_bounds.high_neg == 50.0 and config.variant == "DISPO\u2020"
    )
