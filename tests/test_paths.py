"""rlbook.paths: the stored experiment results are found from the chapters' folders and from anywhere else."""

import pytest

from rlbook.paths import experiment_results_dir


def test_results_found_from_a_chapter_folder_and_from_elsewhere(tmp_path, monkeypatch):
    repository = experiment_results_dir().parents[1]
    monkeypatch.chdir(repository / "notebooks" / "part1")
    assert experiment_results_dir() == repository / "experiments" / "results"
    monkeypatch.chdir(tmp_path)  # a copied notebook, e.g. the student edition: found through the package
    assert experiment_results_dir() == repository / "experiments" / "results"


def test_a_missing_results_folder_is_a_clear_error(tmp_path, monkeypatch):
    import rlbook.paths

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rlbook.paths, "__file__", str(tmp_path / "rlbook" / "paths.py"))
    with pytest.raises(FileNotFoundError, match="experiments/results was not found"):
        experiment_results_dir()

