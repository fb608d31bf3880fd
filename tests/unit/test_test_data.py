"""The real datasets travel with the repository, and a missing one fails the tests that need it."""
import pytest

import tests.conftest as conftest


def test_the_planetoid_files_are_in_the_repository():
    in_repo = conftest.PLANETOID == conftest.REPO / "tests" / "data" / "planetoid"
    assert in_repo or "GRANNDIS_DATASETS" in __import__("os").environ
    assert conftest.require_planetoid() == conftest.PLANETOID


def test_a_missing_dataset_is_a_failure_not_a_skip(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "PLANETOID", tmp_path)
    with pytest.raises(pytest.fail.Exception, match="ind.cora.x"):
        conftest.require_planetoid()
