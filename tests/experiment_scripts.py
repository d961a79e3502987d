"""Helpers of the tests of experiments/: load a script as a module, read its stored results."""

import importlib.util
import json
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def load_script(name):
    """``experiments/<name>.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_stored(name):
    """The stored results of ``experiments/<name>.py``; a missing file fails the test (a chapter reads it)."""
    path = EXPERIMENTS / "results" / f"{name}.json"
    assert path.exists(), f"{path} is missing: run experiments/{name}.py (a chapter reads it)"
    return json.loads(path.read_text())


# Config fields added after a stored run was made, with the value that reproduces the behaviour of the runs made
# before them. A stored config may lack such a field when it holds this value; any other difference is a stale
# result (run the script again).
CONFIG_FIELDS_ADDED = {
    "nonfinite_rewards": "raise",  # issue 23; the stored runs had no non-finite reward
    # TRL 1.16's variants ("After the study note"), each off (or unused) at these values
    "delta": None, "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05,
    "vllm_importance_sampling_correction": False, "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_min": None, "vllm_importance_sampling_clip_max": 3.0,
    "off_policy_mask_threshold": None,
    # TRL 1.16's VESPO (issue 56), unused unless loss_type="vespo"
    "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0,
    # the entropy methods (TRL's and verl's names), each off at these values, and the training split
    "top_entropy_quantile": 1.0, "entropy_coef": 0.0, "use_adaptive_entropy": False, "entropy_coef_min": 0.0,
    "entropy_coef_max": 1.0, "entropy_coef_delta": 0.005, "entropy_target": 0.2, "covariance_method": None,
    "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0, "kl_cov_ratio": 2e-4,
    # unused without a covariance_method; runs of 2026-12-06 before verl's default was adopted stored 1.0
    "ppo_kl_coef": frozenset({0.1, 1.0}),
    "train_split": "train",
}


# Provenance and run-record keys added after stored runs were made (issue 40: when a run started, a confirmatory
# run's plan, each run's CPU seconds): a fresh run has them, an older stored file may not.
PROVENANCE_ADDED = {"started_at", "plan"}
RECORD_ADDED = {"cpu_seconds"}


def record_keys(record: dict) -> list[str]:
    """A run record's keys without those of :data:`RECORD_ADDED` (compare a fresh record with a stored one)."""
    return [k for k in record if k not in RECORD_ADDED]


def provenance_keys(result: dict) -> set[str]:
    """A results file's provenance keys without those of :data:`PROVENANCE_ADDED`."""
    return set(result["provenance"]) - PROVENANCE_ADDED


def comparable_config(config: dict) -> dict:
    """``config`` without the fields of :data:`CONFIG_FIELDS_ADDED` that hold their earlier behaviour (a value, or
    one of a frozenset of values)."""
    def earlier(k, v):
        added = CONFIG_FIELDS_ADDED.get(k, object())
        return v in added if isinstance(added, frozenset) else added == v

    return {k: v for k, v in config.items() if not (k in CONFIG_FIELDS_ADDED and earlier(k, v))}


def assert_same_layout(written: dict, stored: dict, arm: str) -> None:
    """A fresh run's results have the stored file's layout, key for key: the top level, the provenance record, and
    one record of ``arm`` with its metrics and config."""
    assert list(written) == list(stored)
    assert provenance_keys(written) <= set(stored["provenance"])
    new, old = written["runs"][arm][0], stored["runs"][arm][0]
    assert record_keys(new) == record_keys(old)
    assert list(new["metrics"]) == list(old["metrics"])
    assert list(comparable_config(new["config"])) == list(comparable_config(old["config"]))
