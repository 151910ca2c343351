"""What a checkpoint folder must show before the runtime reads a tensor from it.

torch.distributed.checkpoint (DCP) reads a folder's `.metadata` with `pickle.load`
(torch/distributed/checkpoint/filesystem.py FileSystemReader.read_metadata), and a pickle can run
any code while it loads: a checkpoint someone shared would be trusted completely. Here:

* `SafeReader` is the FileSystemReader the runtime loads with; its metadata unpickler resolves
  only the classes DCP's own metadata is made of (`ALLOWED_GLOBALS`, and torch dtypes) and refuses
  anything else naming the class, before any of it runs. Tensors themselves DCP already reads
  with `torch.load(weights_only=True)`;
* a manifest (`moeplan-manifest.json`), written by rank 0 after every save, lists each file of the
  checkpoint with its size, the sha256 of `.metadata` and the model section of the plan that
  saved it; `check_manifest` compares all of it before the metadata is even unpickled, so a
  truncated shard, an edited metadata file or a checkpoint of another model is refused naming the
  file or the model field;
* every file is opened only after `regular_file` saw a regular file of the folder itself: a shard
  that is a symbolic link (to a file elsewhere), a FIFO (whose open would wait for a writer
  forever) or a device is refused naming it, and the unpickled metadata is type-checked entry by
  entry (`check_metadata_shape`) before anything reads a field of it;
* `SaveLock` (`.moeplan-save.lock`, created with O_EXCL by rank 0) keeps two runs from saving into
  one folder at once: the second is refused, naming the first.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import socket
import stat
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from planner.files.json_input import read_json
from planner.files.reading import UnreadableInput
from planner.files.writing import WriteFailed, write_atomic

MANIFEST = "moeplan-manifest.json"
MANIFEST_FORMAT, MANIFEST_VERSION = "moeplan-checkpoint", 1
LOCK = ".moeplan-save.lock"
METADATA = ".metadata"

# Every class a DCP `.metadata` of this runtime's checkpoints pickles (torch 2.13,
# torch/distributed/checkpoint/metadata.py and filesystem.py), plus torch dtypes.
ALLOWED_GLOBALS = frozenset({
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
        "ChunkStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
})


class CheckpointRefused(Exception):
    """A checkpoint folder that fails a trust check; the message names the file, class or key."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, stream: Any, where: str) -> None:
        super().__init__(stream)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise CheckpointRefused(f"{self.where} names {module}.{name}, which no checkpoint this runtime "
                                "writes holds: refused before loading it (a pickle can run code)")


def regular_file(folder: Path | str, name: str) -> Path:
    """`folder/name` when it is a regular file of the folder itself; CheckpointRefused naming it
    when it is a symbolic link, a FIFO, a device, a folder, or a name that leaves the folder."""
    where = Path(folder) / name
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise CheckpointRefused(f"{Path(folder)}: {name[:80]!r} is not a file of this folder")
    try:
        info = os.lstat(where)
    except FileNotFoundError:
        raise CheckpointRefused(f"{where}: no such file") from None
    except OSError as exc:
        raise CheckpointRefused(f"{where}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISLNK(info.st_mode):
        raise CheckpointRefused(f"{where} is a symbolic link: a checkpoint's files must be regular "
                                "files inside its folder (copy the file in, not a link)")
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointRefused(f"{where} is not a regular file (a FIFO, a device, a socket or a "
                                "folder): refused without opening it")
    return where


def _open_regular(folder: Path | str, name: str) -> Any:
    """A binary handle on a checked regular file, opened without following a link or waiting on
    a FIFO put there since the check."""
    where = regular_file(folder, name)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CheckpointRefused(f"{where}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointRefused(f"{where} is not a regular file: refused")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def safe_metadata(path: Path | str) -> Metadata:
    """A folder's DCP metadata, unpickled through the allow-list and type-checked."""
    where = Path(path) / METADATA
    try:
        with _open_regular(path, METADATA) as handle:
            metadata = _MetadataUnpickler(handle, str(where)).load()
    except CheckpointRefused as exc:
        if "no such file" in str(exc):
            raise CheckpointRefused(f"{where}: no such file (not a DCP checkpoint)") from None
        raise
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, RecursionError, MemoryError) as exc:
        raise CheckpointRefused(f"{where} is not readable DCP metadata ({type(exc).__name__}: "
                                f"{str(exc)[:80]})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointRefused(f"{where} holds a {type(metadata).__name__}, not DCP metadata")
    check_metadata_shape(metadata, str(where))
    return metadata


def _size(value: Any) -> bool:
    return isinstance(value, torch.Size) and all(type(n) is int and n >= 0 for n in value)


def _entry_problem(key: Any, entry: Any) -> str | None:
    """Why one state_dict_metadata entry is not what DCP writes (None: it is)."""
    if not isinstance(key, str):
        return f"a key of type {type(key).__name__}"
    if isinstance(entry, BytesStorageMetadata):
        return None
    if not isinstance(entry, TensorStorageMetadata):
        return f"{key[:80]} holds a {type(entry).__name__}, not tensor or bytes metadata"
    props = entry.properties
    if not isinstance(props, TensorProperties) or not isinstance(props.dtype, torch.dtype):
        return f"{key[:80]}: its tensor properties are not DCP's"
    if not _size(entry.size) or not isinstance(entry.chunks, list):
        return f"{key[:80]}: its size or chunk list is not DCP's"
    for chunk in entry.chunks:
        if not isinstance(chunk, ChunkStorageMetadata) or not (_size(chunk.offsets) and _size(chunk.sizes)):
            return f"{key[:80]}: a chunk is not DCP's (offsets and sizes)"
    return None


def _storage_problem(key: Any, info: Any) -> str | None:
    if not isinstance(key, MetadataIndex) or not isinstance(key.fqn, str):
        return f"a storage key of type {type(key).__name__}"
    if not isinstance(info, _StorageInfo) or not isinstance(info.relative_path, str):
        return f"storage of {key.fqn[:80]} is a {type(info).__name__}, not a file, offset and length"
    if type(info.offset) is not int or type(info.length) is not int or info.offset < 0 or info.length < 0:
        return f"storage of {key.fqn[:80]}: offset {info.offset!r:.20} / length {info.length!r:.20}"
    return None


def check_metadata_shape(metadata: Metadata, where: str) -> None:
    """Every entry the loader will read a field of is of DCP's own type (torch/distributed/
    checkpoint/metadata.py, filesystem.py _StorageInfo): an int or a list in its place, which the
    allow-list unpickler lets through, is refused naming the file, not met later as an
    AttributeError."""
    entries, storage = metadata.state_dict_metadata, metadata.storage_data
    if not isinstance(entries, dict) or not isinstance(storage, dict | None):
        raise CheckpointRefused(f"{where}: its state_dict_metadata or storage_data is not a mapping")
    for key, entry in entries.items():
        if problem := _entry_problem(key, entry):
            raise CheckpointRefused(f"{where}: {problem}: not metadata DCP wrote")
    for key, info in (storage or {}).items():
        if problem := _storage_problem(key, info):
            raise CheckpointRefused(f"{where}: {problem}: not metadata DCP wrote")


class SafeReader(FileSystemReader):
    """DCP's file-system reader with the allow-list unpickler for `.metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = safe_metadata(self.path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with _open_regular(path.parent, path.name) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_files(folder: Path, metadata: Metadata) -> list[str]:
    """The files a checkpoint consists of: `.metadata` and every shard its storage data names."""
    shards = {info.relative_path for info in (metadata.storage_data or {}).values()}
    return sorted({METADATA, *shards})


def write_manifest(folder: Path, model: dict[str, Any], steps: int, world_size: int) -> None:
    """Rank 0, after DCP's save returned on every rank."""
    metadata = safe_metadata(folder)
    manifest = {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "model": model, "steps": steps,
        "world_size": world_size, "metadata_sha256": _sha256(folder / METADATA),
        "files": {name: (folder / name).stat().st_size for name in checkpoint_files(folder, metadata)},
    }
    try:
        write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    except WriteFailed as exc:
        raise CheckpointRefused(f"cannot write the checkpoint manifest: {exc}") from None


def _model_difference(saved: dict[str, Any], mine: dict[str, Any]) -> str | None:
    for key in sorted(set(saved) | set(mine)):
        if saved.get(key) != mine.get(key):
            return (f"model.{key} is {str(saved.get(key))[:40]} in the checkpoint, "
                    f"{str(mine.get(key))[:40]} in this plan")
    return None


def check_manifest(folder: Path, model: dict[str, Any]) -> dict[str, Any]:
    """Everything the manifest promises, checked before the metadata is unpickled."""
    where = folder / MANIFEST
    if os.path.lexists(where):
        regular_file(folder, MANIFEST)
    try:
        manifest = read_json(where, "profile")
    except UnreadableInput as exc:
        if exc.code == "FILE001":
            raise CheckpointRefused(f"{folder} has no {MANIFEST}: not a checkpoint this runtime saved "
                                    "(or its save did not finish)") from None
        raise CheckpointRefused(f"{where}: {exc.reason}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointRefused(f"{where} is not a moeplan checkpoint manifest")
    if manifest.get("version") != MANIFEST_VERSION:
        raise CheckpointRefused(f"{where}: manifest version {manifest.get('version')!r}, this runtime "
                                f"reads version {MANIFEST_VERSION}")
    files, saved_model = manifest.get("files"), manifest.get("model")
    if not isinstance(files, dict) or not isinstance(saved_model, dict):
        raise CheckpointRefused(f"{where} lacks its 'files' or 'model' entry")
    difference = _model_difference(saved_model, model)
    if difference:
        raise CheckpointRefused(f"{folder} was saved from another model: {difference}")
    for name, size in sorted(files.items()):
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            raise CheckpointRefused(f"{where} lists {name!r}, which is not a file of this folder")
        if type(size) is not int:
            raise CheckpointRefused(f"{where}: the size of {name[:80]} is {size!r:.40}, not a number "
                                    "of bytes")
        if not os.path.lexists(folder / name):
            raise CheckpointRefused(f"{folder}/{name} is missing (the manifest lists it)")
        found = regular_file(folder, name).stat().st_size
        if found != size:
            raise CheckpointRefused(f"{folder}/{name} is {found:,} bytes, the manifest says {size:,}: "
                                    "truncated or replaced after the save")
    if _sha256(folder / METADATA) != manifest.get("metadata_sha256"):
        raise CheckpointRefused(f"{folder}/{METADATA} was changed after the save (its sha256 is not "
                                "the manifest's)")
    return manifest


def check_metadata_files(folder: Path, metadata: Metadata, manifest: dict[str, Any]) -> None:
    """Every file the metadata will make DCP open is one the manifest listed (no `../`)."""
    unlisted = sorted(set(checkpoint_files(folder, metadata)) - set(manifest["files"]))
    if unlisted:
        raise CheckpointRefused(f"{folder}/{METADATA} reads {unlisted[0]!r}, which the manifest does "
                                "not list: refused")


class SaveLock:
    """Rank 0's claim on a --save folder for the length of one save."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK
        self.held = False

    def acquire(self) -> str | None:
        """None when claimed; else why not (another run holds it, or the folder is unwritable)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                holder = self.path.read_text(errors="replace").strip()[:200]
            except OSError:
                holder = "unknown"
            return (f"another run is saving into {self.path.parent} ({holder}); wait for it, save "
                    f"elsewhere, or remove {self.path} if that run is dead")
        except OSError as exc:
            return f"cannot save into {self.path.parent}: {exc.strerror or exc}"
        with os.fdopen(fd, "w") as handle:
            handle.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        self.held = True
        return None

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
