"""A packaged model split byte-wise over several installed distributions
(:class:`~opefo_nemo.models.packaged.SplitPackagedModel`): found through real ``.dist-info``
directories on ``sys.path``, joined in order, checked against the recorded size and sha256, and
refused, naming what to install, when a part is missing, of another release or corrupt."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from opefo_nemo.models.packaged import (
    QWEN2_INSTALL_HINT,
    PackagedModelUnavailableError,
    SplitPackagedModel,
    join_parts,
    recipe,
)

PARTS = 3


@pytest.fixture
def site(tmp_path, monkeypatch):
    """Three installed distributions ``opefo-split-part<i>`` 1.0, each holding one part of random
    bytes (the last shorter); returns the site directory and the whole file's bytes."""
    root = tmp_path / "site"
    whole = b""
    for i in range(1, PARTS + 1):
        info = root / f"opefo_split_part{i}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: opefo-split-part{i}\nVersion: 1.0\n"
        )
        data = os.urandom(1000 if i < PARTS else 333)
        (root / f"opefo_split_part{i}" / "data").mkdir(parents=True)
        (root / f"opefo_split_part{i}" / "data" / "part.bin").write_bytes(data)
        whole += data
    monkeypatch.syspath_prepend(str(root))
    return root, whole


def _model(whole: bytes, version: str = "1.0", sha256: str | None = None) -> SplitPackagedModel:
    return SplitPackagedModel(
        name="split_test",
        distributions=tuple(f"opefo-split-part{i}" for i in range(1, PARTS + 1)),
        version=version,
        files=tuple(f"opefo_split_part{i}/data/part.bin" for i in range(1, PARTS + 1)),
        sha256=sha256 or hashlib.sha256(whole).hexdigest(),
        size=len(whole),
    )


def test_parts_are_joined_in_order_and_reused(site, tmp_path):
    _, whole = site
    target = tmp_path / "out" / "model.gguf"
    assert join_parts(_model(whole), target) == target
    assert target.read_bytes() == whole
    written = target.stat().st_mtime_ns
    assert join_parts(_model(whole), target) == target  # already there: not written again
    assert target.stat().st_mtime_ns == written


def test_a_corrupt_join_is_refused_and_left_nowhere(site, tmp_path):
    _, whole = site
    target = tmp_path / "model.gguf"
    with pytest.raises(PackagedModelUnavailableError, match="reinstall them"):
        join_parts(_model(whole, sha256="0" * 64), target)
    assert list(tmp_path.glob("*model.gguf*")) == []


def test_a_missing_or_other_release_of_a_part_names_what_to_install(site, tmp_path):
    root, whole = site
    with pytest.raises(PackagedModelUnavailableError, match=r"opefo-split-part1==2\.0, found 1\.0"):
        join_parts(_model(whole, version="2.0"), tmp_path / "a.gguf")
    (root / "opefo_split_part2" / "data" / "part.bin").unlink()
    with pytest.raises(PackagedModelUnavailableError, match="opefo-split-part2 has no"):
        join_parts(_model(whole), tmp_path / "b.gguf")
    absent = SplitPackagedModel("absent", ("opefo-no-such-part",), "1.0", ("x.bin",), "0", 1)
    with pytest.raises(PackagedModelUnavailableError) as error:
        join_parts(absent, tmp_path / "c.gguf")
    assert QWEN2_INSTALL_HINT in str(error.value)


def test_the_recipe_of_a_split_model_is_plain_json(site):
    _, whole = site
    written = recipe(_model(whole))
    assert json.loads(json.dumps(written)) == written
    assert written["distributions"] == [f"opefo-split-part{i}" for i in range(1, PARTS + 1)]
