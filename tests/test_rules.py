"""Every cross-field rule of the loss is written once: the table below names each rule, a setting that breaks it,
the words of its one message and the one function that holds them. The test breaks each rule and checks the
message, and reads the package's source to check that the message is written in exactly one place (a second copy,
even with drifted words, would need its own row here and fail the count of its home's words elsewhere)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import rlbook
from rlbook import losses, objectives, presets
from rlbook.presets import RLConfig

SOURCE = Path(rlbook.__file__).parent

# (rule, settings that break it, words of its message, its one home)
RULES = [
    ("delta lies above the clip range", dict(delta=1.1), "delta must be a finite number above 1 + epsilon_high",
     objectives.check_delta),
    ("delta and the covariance methods act on PPO-Clip's token loss", dict(loss_type="sapo", delta=3.0),
     "acts on PPO-Clip's token loss", losses.config_errors),
    ("CISPO's cap is epsilon_high itself, above 1", dict(loss_type="cispo", epsilon_high=0.28),
     "caps the importance weight at epsilon_high itself", losses._cispo_cap),
    ("a per-completion loss takes no token weights", dict(loss_type="gmpo", epsilon=0.4, top_entropy_quantile=0.2),
     "weigh or choose token losses, but loss_type=", losses.per_completion_refuses),
    ("a surrogate's ratio levels", dict(loss_type="vespo", importance_sampling_level="sequence"),
     "computes token ratios: it needs ", losses.config_errors),
    ("VESPO folds only token-level sampler corrections",
     dict(loss_type="vespo", vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="sequence_mask"),
     "folds the sampler correction's token weights into its own sequence weight", losses._vespo_token_correction),
    ("the ratio's lower clip stays positive (except a log-space clip)", dict(epsilon=1.0),
     "the lower clip 1 - epsilon must stay positive", presets._check),
    ("clip-higher widens the upper side (except a log-space clip)", dict(epsilon=0.2, epsilon_high=0.1),
     "is below epsilon", presets._check),
    ("SAPO's temperatures", dict(loss_type="sapo", sapo_temperature_neg=0.0),
     "the gate's 4 / temperature overflows below", objectives.check_sapo_temperatures),
]


@pytest.mark.parametrize("rule, settings, words, home", RULES, ids=[r[0] for r in RULES])
def test_each_rule_has_one_message_in_one_home(rule, settings, words, home):
    with pytest.raises(ValueError, match=re.escape(words)):
        RLConfig(**settings)
    assert words in inspect.getsource(home), f"{rule}: its words are not in {home.__qualname__}"
    places = [(path.relative_to(SOURCE), path.read_text().count(words)) for path in SOURCE.rglob("*.py")]
    places = [(path, n) for path, n in places if n]
    assert places == [(Path(inspect.getsourcefile(home)).relative_to(SOURCE), 1)], (
        f"{rule}: its message must be written once, in {home.__qualname__}; found {places}")


def test_the_loss_refuses_what_the_config_refuses_with_the_same_words():
    """A token weight handed straight to the loss (not through a config) meets the config's rule and message."""
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="entropy_mask weigh or choose token losses, but loss_type='gmpo' has one "
                                         "loss per completion"):
        objectives.policy_loss(logp, logp, torch.ones(2), torch.ones(2, 3), loss_type="gmpo", epsilon=0.4,
                               entropy_mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="delta must be a finite number above 1 \\+ epsilon_high"):
        objectives.clipped_surrogate(torch.ones(2, 3), torch.ones(2, 3), 0.2, 0.2, delta=1.1)


def test_every_loss_type_is_a_registered_surrogate_and_aggregation():
    """LOSS_TYPES is the taxonomy: each row names a registered surrogate and a declared aggregation, and the
    config accepts exactly its keys."""
    for loss_type, (surrogate, aggregation) in losses.LOSS_TYPES.items():
        assert surrogate in losses.SURROGATES and aggregation in losses.AGGREGATIONS, loss_type
        assert losses.AGGREGATIONS[aggregation].divides_by in ("completions", "tokens", "step_tokens")
        epsilon_high = 5.0 if loss_type == "cispo" else None
        RLConfig(loss_type=loss_type, epsilon=0.4 if loss_type == "gmpo" else 0.2, epsilon_high=epsilon_high)
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'"):
        RLConfig(loss_type="ppo")
