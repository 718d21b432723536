"""Models from the Hugging Face hub: `org/name[@revision]`, resolved cache first.

A hub id resolves to a snapshot directory of the hub cache (`download_dir`, else
huggingface_hub's own: `$HF_HUB_CACHE`, `$HF_HOME/hub`, ~/.cache/huggingface/hub).
The cache is looked at first, without a network call; a download happens only when the
cache lacks the files and downloads are allowed (`HF_HUB_OFFLINE` unset) and the hub is
reachable; `HF_TOKEN` authenticates it (private and gated repositories). Otherwise the
error names the model, the cache directory and what to do.

The worker needs the weights, the router only the tokenizer files: a snapshot the router
fetched (tokenizer only) does not count as a cached model for a worker.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from radixmesh.errors import InvalidArgument

# org/name, optionally @revision (a branch, a tag or a commit hash).
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")
# What a Llama-family checkpoint needs; not the *.bin / *.pth copies many repositories add.
WEIGHT_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
TOKENIZER_PATTERNS = ["*.json", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubModel:
    repo_id: str
    revision: str | None = None  # None: the default branch

    @property
    def name(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_hub_id(spec: str, revision: str | None = None) -> HubModel | None:
    """The hub model a spec names, or None when it is not of the form org/name[@rev].
    `revision` (the --revision option) must agree with an @revision in the spec."""
    m = _HUB_ID.match(spec)
    if m is None:
        return None
    rev = m.group("rev")
    if rev and revision and rev != revision:
        raise InvalidArgument(
            "revision", f"{spec!r} names revision {rev!r} but revision is {revision!r}"
        )
    return HubModel(m.group("repo"), rev or revision)


def cache_dir(download_dir: str | None) -> str:
    if download_dir:
        return str(Path(download_dir).expanduser())
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def downloads_off() -> bool:
    """HF_HUB_OFFLINE, read now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE")
    return env.upper() in _TRUE if env is not None else bool(constants.HF_HUB_OFFLINE)


def snapshot(model: HubModel, download_dir: str | None = None, *, weights: bool = True) -> Path:
    """The local snapshot directory of `model` with its weights (weights=True) or only its
    tokenizer files: from the cache, else downloaded where allowed; InvalidArgument("model")
    naming the model and the cache directory when neither works."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = cache_dir(download_dir)
    patterns = WEIGHT_PATTERNS if weights else TOKENIZER_PATTERNS
    try:
        path = _fetch(model, cache, patterns, local_only=True)
        if complete(path, weights):
            return path
    except LocalEntryNotFoundError:
        pass
    what = "model" if weights else "tokenizer"
    if downloads_off():
        raise InvalidArgument(
            "model",
            f"{model.name}: its {what} files are not in the Hugging Face cache {cache} and "
            "downloads are off (HF_HUB_OFFLINE=1); fetch it first where the hub is reachable "
            f"(`radixmesh download {model.name} --download-dir {cache}`)",
        )
    path = _download(model, cache, patterns)
    if not complete(path, weights):
        raise InvalidArgument(
            "model",
            f"{model.name}: the repository has no {what} files radixmesh can load "
            "(config.json and *.safetensors; tokenizer.json or tokenizer_config.json)",
        )
    return path


def _fetch(model: HubModel, cache: str, patterns: list[str], *, local_only: bool) -> Path:
    from huggingface_hub import snapshot_download

    path = snapshot_download(
        model.repo_id,
        revision=model.revision,
        cache_dir=cache,
        allow_patterns=patterns,
        local_files_only=local_only,
    )
    return Path(path)


def _download(model: HubModel, cache: str, patterns: list[str]) -> Path:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return _fetch(model, cache, patterns, local_only=False)
    except GatedRepoError as e:
        reason = "the repository is gated: accept its terms on the hub and set HF_TOKEN"
        raise InvalidArgument("model", f"{model.name}: {reason}") from e
    except RevisionNotFoundError as e:
        raise InvalidArgument("revision", f"{model.name}: no such revision on the hub") from e
    except RepositoryNotFoundError as e:
        reason = "no such repository on the hub (a private one needs HF_TOKEN)"
        raise InvalidArgument("model", f"{model.name}: {reason}") from e
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as e:
        raise InvalidArgument(
            "model",
            f"{model.name} is not in the Hugging Face cache {cache} and the hub cannot be "
            f"reached to download it ({type(e).__name__}: {_first_line(e)})",
        ) from e


def complete(path: Path, weights: bool) -> bool:
    """Whether a snapshot holds what a worker (weights) or a router (tokenizer) loads."""
    if not (path / "config.json").is_file():
        return False
    if not weights:
        return any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        import json

        shards = set(json.loads(index.read_text())["weight_map"].values())
        return all((path / s).is_file() for s in shards)
    return any(path.glob("*.safetensors"))


def pinned_name(model: HubModel, path: Path) -> str:
    """org/name@<commit>: the exact revision a snapshot directory holds, for a router to
    load the same tokenizer files."""
    return f"{model.repo_id}@{path.name}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
