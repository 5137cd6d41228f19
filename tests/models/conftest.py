"""Fixtures of the model tests."""

import pytest

from tests.models.hf_helpers import make_hf_model


@pytest.fixture
def hf_checkpoint(tmp_path):
    """Factory: (directory, torch model) of a saved random checkpoint."""

    def make(arch="qwen2", max_shard_size=None, **kwargs):
        model = make_hf_model(arch, **kwargs)
        path = tmp_path / f"{arch}-{len(list(tmp_path.iterdir()))}"
        extra = {"max_shard_size": max_shard_size} if max_shard_size else {}
        model.save_pretrained(path, **extra)
        return str(path), model

    return make
