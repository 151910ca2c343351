"""Which Megatron a config runs on: the releases, container branches and commits moeplan can place,
in one order, so the rules whose behaviour changed between versions (and the known-bad ranges,
planner/rules/known_bugs.py) can ask "is this version before that one".

Every row is a tag or branch of github.com/NVIDIA/Megatron-LM, with its commit and date as that
repository records them: the `core_vX.Y.Z` release tags, the NeMo container branches `25.04-alpha`,
`25.09-alpha` and `26.04-alpha` (the Megatron-LM a `nemo:YY.MM` container ships), and the two
commits moeplan is checked against, dev@d48bd6be (the default) and main@d98e8a64, and main commits
launchers pin (Primus's main@d3528a21). The order is the order a fix reaches them: each row holds
every fix an earlier row holds (checked by hand, fix by fix, on the tagged sources for every record
of planner/rules/versions.py); a main commit between tags sits at its date and names in `fixes` the
ones it holds ahead of the next release (read off its ancestry). A version moeplan cannot place
is `None` here and a finding of rule VER001, never silently dev.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REPOSITORY = "https://github.com/NVIDIA/Megatron-LM"


@dataclass(frozen=True)
class Release:
    """One Megatron-LM version moeplan can place: its name, the commit it is, that commit's date and
    the other spellings users write for it."""

    name: str
    commit: str
    date: str
    aliases: tuple[str, ...] = ()
    # A commit on the main line between two tags (one a launcher pins) holds some fixes before the
    # next release does: the keys of planner/rules/versions.py RECORDS whose fixing change is its
    # ancestor although a later row is the first release with it.
    fixes: tuple[str, ...] = ()

    @property
    def rank(self) -> int:
        """Position in RELEASES: a fix in one row is in every later row."""
        return _RANK[self.name]

    def before(self, other: str) -> bool:
        """Whether this version comes before release `other` (a name in RELEASES)."""
        return self.rank < _RANK[other]

    @property
    def label(self) -> str:
        """The short name findings use: `dev@d48bd6be` for a branch, the release name otherwise."""
        return next((a for a in self.aliases if "@" in a), self.name)

    def shown(self) -> str:
        """`core_r0.16.0 (3bec9aa9, 2026-02-26)`."""
        return f"{self.name} ({self.commit[:8]}, {self.date})"


def _core(minor: int, patch: int, commit: str, date: str) -> Release:
    """A `core_vX.Y.Z` release tag; its branch is `core_rX.Y.0`, pip's `megatron-core==X.Y.Z`."""
    version = f"0.{minor}.{patch}"
    aliases = (f"core_v{version}", f"v{version}", version, f"megatron-core=={version}")
    if patch == 0:
        aliases += (f"core_r0.{minor}.0",)
    return Release(f"core_r{version}" if patch == 0 else f"core_v{version}", commit, date, aliases)


def _container(branch: str, commit: str, date: str) -> Release:
    """A NeMo container branch of Megatron-LM (`25.09-alpha`): what `nemo:25.09` ships."""
    tag = branch.split("-")[0]
    return Release(branch, commit, date, (tag, f"nemo:{tag}", f"nvcr.io/nvidia/nemo:{tag}"))


# In the order fixes reach them (each row's commit date is the tag's, github.com/NVIDIA/Megatron-LM).
RELEASES: tuple[Release, ...] = (
    _container("25.04-alpha", "53596ecae8b6e85890768f2b169fbf7911e4ed6c", "2025-04-18"),
    _core(13, 0, "c550cf6c41c31cd3ec72e05c25ea0c979f2b6631", "2025-07-25"),
    _core(13, 1, "ea651a3b78b9b0c1dfd83975ff28853e38e5abaa", "2025-08-11"),
    _container("25.09-alpha", "d33919011c7010e026d7c260d9d3016852cedcd2", "2025-10-01"),
    _core(14, 0, "23e00ed0963c35382dfe8a5a94fb3cda4d21e133", "2025-10-08"),
    _core(15, 0, "0d7e02bd26d3eb347ad8d1bef625002babfa6df7", "2025-12-05"),
    _core(15, 1, "512da5deb1fdc6ad8135bd07c6277628c4009261", "2026-01-07"),
    _core(15, 2, "45b404c8aa2ff923d1e0a8b0ee8aec45d827cef4", "2026-01-08"),
    _core(15, 3, "309ffca6a40553362d44fd17efc56b772fa1aa44", "2026-02-06"),
    _core(16, 0, "3bec9aa97dda898d16ff5a89bac0ed2b6682b172", "2026-02-26"),
    # The Megatron-LM that AMD-AGI/Primus pins (primus/_thirdparty.lock at fd1eeabb): a main commit
    # ("fix(moe): fix TE general_gemm API change (#3582)") first released in core_v0.17.0. Its
    # ancestors hold PR #3159 (a22c40e8), #3396 (d7500d4d) and #2237 (f6e0d425); not #3562, #4593,
    # #5047 or #5115; HybridEP is in it; none of the branch features of FEATURE_ROWS is.
    Release("main@d3528a21", "d3528a21301db2d12e92912b3ec025dc8a2ed4d6", "2026-03-06", ("d3528a21",),
            fixes=("mtp-per-token-loss", "mtp-cp-nan")),
    _core(16, 1, "55ac7082517c3878ae653c07c09c534b8aed49f6", "2026-03-16"),
    _core(17, 0, "9539a12e1b04a68423f57b3eb41d6125161dca24", "2026-04-14"),
    _container("26.04-alpha", "0fcbc3db89c448a52c0ad6e17b882ebada1d8782", "2026-05-09"),
    _core(17, 1, "266f1c97dca477ca8b92c16087506da2000b0b84", "2026-05-25"),
    _core(18, 0, "ba7b5ebce12af60627a80985792a1449ce45f46c", "2026-06-22"),
    _core(18, 2, "571370c829ca768fe37244f4e2e7f28d8accc4ab", "2026-07-20"),
    _core(19, 0, "5be9626709af2722333bf54797c954c09edeada3", "2026-08-19"),
    Release("dev", "d48bd6be0a85cc0d6d3cc71e8750cf357cc6bdb1", "2026-08-21", ("dev@d48bd6be",)),
    Release("main", "d98e8a64ddf34856e74b24714e3bedb2f5a39553", "2026-08-22", ("main@d98e8a64",)),
)
_RANK = {r.name: i for i, r in enumerate(RELEASES)}
# The version moeplan's rules follow when the config names none: the oracle's commit.
DEFAULT_VERSION = "dev"
_SPELLINGS = {spelling.lower(): r for r in RELEASES for spelling in (r.name, *r.aliases)}
_HEX = re.compile(r"[0-9a-f]{7,40}")


def release(name: str) -> Release:
    """The row named `name` (a name this module defines)."""
    return RELEASES[_RANK[name]]


def resolve_version(text: str) -> Release | None:
    """The release a `megatron.version` string names: a release (`core_r0.14.0`, `0.14.0`,
    `megatron-core==0.14.0`), a container (`25.09`, `nemo:25.09`, `nvcr.io/nvidia/nemo:25.09`), a
    branch (`dev`, `main`) or a commit (7 to 40 hex digits of a row's commit). None: not placeable."""
    key = text.strip().lower()
    if key in _SPELLINGS:
        return _SPELLINGS[key]
    if _HEX.fullmatch(key):
        hits = [r for r in RELEASES if r.commit.startswith(key)]
        return hits[0] if len(hits) == 1 else None
    return None


def known_spellings() -> str:
    """The version names a finding lists as the ways out."""
    return ", ".join(r.name for r in RELEASES)
