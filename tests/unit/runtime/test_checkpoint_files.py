"""A checkpoint folder's files are read only when they are regular files of the folder, and its
metadata only when every entry is of DCP's own type (issue 36): a shard that links elsewhere, a
FIFO, an int where a storage entry belongs are refused naming the file, in-process and at once."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from runtime.checkpoint_trust import (
    MANIFEST,
    METADATA,
    CheckpointRefused,
    check_manifest,
    safe_metadata,
    write_manifest,
)

MODEL = {"num_layers": 1}
SHARD = "__0_0.distcp"


def _metadata(storage: object = None, entries: object = None) -> Metadata:
    size = torch.Size([2])
    tensor = TensorStorageMetadata(TensorProperties(dtype=torch.float32), size,
                                   [ChunkStorageMetadata(torch.Size([0]), size)])
    return Metadata(state_dict_metadata={"w": tensor} if entries is None else entries,
                    storage_data={MetadataIndex("w", torch.Size([0])): _StorageInfo(SHARD, 0, 8)}
                    if storage is None else storage)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A checkpoint folder as the runtime saves it: metadata, one shard, the manifest."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / METADATA).write_bytes(pickle.dumps(_metadata()))
    (ckpt / SHARD).write_bytes(b"\0" * 8)
    write_manifest(ckpt, MODEL, 1, 1)
    return ckpt


def test_a_saved_folder_passes(folder: Path) -> None:
    assert check_manifest(folder, MODEL)["files"] == {METADATA: os.path.getsize(folder / METADATA),
                                                      SHARD: 8}
    assert isinstance(safe_metadata(folder), Metadata)


def test_a_shard_that_links_elsewhere_is_refused(folder: Path, tmp_path: Path) -> None:
    """Before, the link was followed and the file elsewhere read (its size matched the manifest)."""
    elsewhere = tmp_path / "secret.bin"
    elsewhere.write_bytes(b"\1" * 8)
    (folder / SHARD).unlink()
    (folder / SHARD).symlink_to(elsewhere)
    with pytest.raises(CheckpointRefused, match=rf"{SHARD} is a symbolic link: a checkpoint's files "
                                                "must be regular files inside its folder"):
        check_manifest(folder, MODEL)


@pytest.mark.parametrize("name", [SHARD, METADATA, MANIFEST])
def test_a_fifo_is_refused_without_opening_it(folder: Path, name: str) -> None:
    """Before, a FIFO in the folder hung the load past every timeout."""
    (folder / name).unlink()
    os.mkfifo(folder / name)
    started = time.monotonic()
    with pytest.raises(CheckpointRefused, match=rf"{name} is not a regular file"):
        check_manifest(folder, MODEL) if name != METADATA else safe_metadata(folder)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(("storage", "entries", "says"), [
    ({MetadataIndex("w"): 5}, None, "storage of w is a int, not a file, offset and length"),
    ({MetadataIndex("w"): _StorageInfo(SHARD, -1, 8)}, None, "storage of w: offset -1"),
    ({"w": _StorageInfo(SHARD, 0, 8)}, None, "a storage key of type str"),
    ([1, 2], None, "storage_data is not a mapping"),
    (None, {"w": [1, 2]}, "w holds a list, not tensor or bytes metadata"),
    (None, {"w": TensorStorageMetadata(TensorProperties(dtype=torch.float32), 3, [])},
     "w: its size or chunk list is not DCP's"),
])
def test_metadata_entries_are_type_checked(folder: Path, storage: object, entries: object,
                                           says: str) -> None:
    """Unpickle-free but crafted: before, an int where a storage entry belongs ended in an
    AttributeError traceback (exit 3)."""
    (folder / METADATA).write_bytes(pickle.dumps(_metadata(storage, entries)))
    with pytest.raises(CheckpointRefused, match=None) as caught:
        safe_metadata(folder)
    assert str(folder / METADATA) in str(caught.value) and says in str(caught.value)


def test_a_manifest_size_that_is_not_a_number_is_refused(folder: Path) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][SHARD] = "8"
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointRefused, match=f"the size of {SHARD} is '8', not a number of bytes"):
        check_manifest(folder, MODEL)


def test_a_vocabulary_padded_otherwise_is_refused_naming_the_padding() -> None:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by · TP and trains
    the padding rows: a checkpoint saved at 128 rows does not load into a plan that pads to 256
    (TP 1 → TP 2 at the default 128), while equal padding under any TP loads."""
    from runtime.checkpoint import vocabulary_problems
    from runtime.plan_io import Plan

    plan = Plan({"layout": {"padded_vocab_size": 256}})
    problems = vocabulary_problems(Path("ckpt"), {"embedding": (128, 32), "head": (128, 32)}, plan)
    assert len(problems) == 1
    assert "padded to 128 rows" in problems[0] and "layout.padded_vocab_size is 256" in problems[0]
    assert "make_vocab_size_divisible_by" in problems[0]
    assert vocabulary_problems(Path("ckpt"), {"embedding": (256, 32)}, plan) == []
