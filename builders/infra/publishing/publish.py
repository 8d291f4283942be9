"""Publish a build folder to the Hub as an immutable, tagged version.

Uploads go in several commits of bounded size (large pushes are where users hit timeouts and
429s), each skipped when the Hub already holds identical bytes, so re-running after an
interruption finishes the same version without re-committing unchanged shards. The last commit
writes the card and manifest and deletes shards of older versions that this one no longer has;
then the tag is created on exactly that commit. An existing tag is never moved.

The token comes from the environment or `huggingface_hub` login; nothing here writes it anywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from builders.infra.errors import UserFacingError
from builders.infra.sharding.layout import MANIFEST, PARTS_DIR

log = logging.getLogger(__name__)

VERSION_RE = re.compile(r"^v\d+\.\d+\.\d+$")
T = TypeVar("T")


@dataclass
class PublishConfig:
    """What to publish where."""

    output_dir: Path
    #: `ORG/NAME` of the dataset repo (created when missing).
    repo_id: str
    #: Semantic version tag, e.g. `v1.0.0`; tags are immutable.
    version: str
    #: Hub URL; default is `HF_ENDPOINT` / huggingface.co.
    endpoint: str | None = None
    private: bool = False
    #: Upper bound on the bytes of one data commit.
    max_commit_bytes: int = 1_000_000_000
    #: Upper bound on the files of one data commit.
    max_commit_files: int = 100
    #: Attempts for one Hub call that fails with 429/5xx or a connection error.
    retries: int = 5


@dataclass
class PublishResult:
    repo_id: str
    version: str
    commit: str
    data_commits: int
    uploaded_files: int
    unchanged_files: int


def git_blob_oid(data: bytes) -> str:
    """The git object id of a file's bytes (what the Hub reports for non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_version(version: str) -> None:
    if not VERSION_RE.match(version):
        raise UserFacingError(f"--version {version!r} must look like v1.2.3")


def refuse_existing_tag(api, repo: dict, version: str, retries: int) -> None:
    """Tags are immutable: fail, naming the tagged commit, when `version` is already a tag."""
    refs = _retrying(lambda: api.list_repo_refs(**repo), retries, "list_repo_refs")
    tags = {t.name: t.target_commit for t in refs.tags}
    if version in tags:
        raise UserFacingError(
            f"{repo['repo_id']} already has tag {version} (commit {tags[version][:10]}); "
            "tags are never moved — publish under a new version, e.g. bump the patch number"
        )


def _retrying(call: Callable[[], T], retries: int, what: str) -> T:
    from huggingface_hub.errors import HfHubHTTPError

    delay = 1.0
    for attempt in range(1, retries + 1):
        try:
            return call()
        except HfHubHTTPError as err:
            status = err.response.status_code if err.response is not None else None
            if status not in (429, 500, 502, 503, 504) or attempt == retries:
                raise
            log.warning("%s failed with HTTP %s; retrying in %.0f s", what, status, delay)
        except (ConnectionError, TimeoutError) as err:
            if attempt == retries:
                raise
            log.warning("%s failed (%s); retrying in %.0f s", what, err, delay)
        time.sleep(delay)
        delay = min(delay * 2, 60.0)
    raise AssertionError("unreachable")


def _local_files(output_dir: Path) -> dict[str, Path]:
    """Files that make up the published version (everything but the resumable work area)."""
    files = {}
    for path in sorted(output_dir.rglob("*")):
        rel = path.relative_to(output_dir).as_posix()
        if path.is_file() and not rel.startswith(PARTS_DIR + "/") and not rel.endswith(".tmp"):
            files[rel] = path
    return files


def _check_build(output_dir: Path) -> dict:
    manifest_path = output_dir / MANIFEST
    if not manifest_path.exists():
        raise UserFacingError(
            f"{manifest_path} is missing: {output_dir} is not a finished counterfactory build "
            "(run or resume the build first)"
        )
    scripts = [p.name for p in output_dir.glob("*.py")]
    if scripts:
        raise UserFacingError(
            f"{output_dir} contains loading script(s) {scripts}; published versions must load "
            "with plain load_dataset from parquet, remove them"
        )
    return json.loads(manifest_path.read_text())


def publish(cfg: PublishConfig) -> PublishResult:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    from builders.infra.publishing.card import render_card

    check_version(cfg.version)
    output_dir = Path(cfg.output_dir)
    manifest = _check_build(output_dir)
    api = HfApi(endpoint=cfg.endpoint)
    repo = dict(repo_id=cfg.repo_id, repo_type="dataset")
    _retrying(lambda: api.create_repo(**repo, private=cfg.private, exist_ok=True),
              cfg.retries, "create_repo")

    refuse_existing_tag(api, repo, cfg.version, cfg.retries)

    remote = {
        f.path: f
        for f in _retrying(lambda: list(api.list_repo_tree(**repo, recursive=True, revision="main")),
                           cfg.retries, "list_repo_tree")
        if hasattr(f, "blob_id")
    }
    files = _local_files(output_dir)
    # The card is re-rendered for this repo and version; the local README is the unreleased one.
    final = {
        "README.md": render_card(manifest, repo_id=cfg.repo_id, version=cfg.version).encode(),
        MANIFEST: files[MANIFEST].read_bytes(),
    }

    def unchanged(path: str, data: bytes) -> bool:
        entry = remote.get(path)
        if entry is None:
            return False
        if entry.lfs is not None:
            return entry.lfs.sha256 == hashlib.sha256(data).hexdigest()
        return entry.blob_id == git_blob_oid(data)

    # Data files first, in bounded commits; README + manifest + deletions last, so a version's
    # card never describes shards that are not there yet.
    batches: list[list[tuple[str, Path]]] = [[]]
    batch_bytes = 0
    skipped = 0
    for path, local in files.items():
        if path in final or path == "README.md":
            continue
        data = local.read_bytes()
        if unchanged(path, data):
            skipped += 1
            continue
        size = len(data)
        if batches[-1] and (batch_bytes + size > cfg.max_commit_bytes
                            or len(batches[-1]) >= cfg.max_commit_files):
            batches.append([])
            batch_bytes = 0
        batches[-1].append((path, local))
        batch_bytes += size
    batches = [b for b in batches if b]

    for i, batch in enumerate(batches, 1):
        ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(local)) for p, local in batch]
        _retrying(lambda: api.create_commit(**repo, operations=ops,
                                            commit_message=f"{cfg.version}: data {i}/{len(batches)}"),
                  cfg.retries, f"data commit {i}/{len(batches)}")
        log.info("uploaded data commit %d/%d (%d files)", i, len(batches), len(batch))

    final_ops: list = [
        CommitOperationAdd(path_in_repo=p, path_or_fileobj=data)
        for p, data in sorted(final.items())
        if not unchanged(p, data)
    ]
    final_ops += [CommitOperationDelete(path_in_repo=p) for p in sorted(remote)
                  if p not in files and p not in final and p != ".gitattributes"]
    if final_ops:
        info = _retrying(lambda: api.create_commit(**repo, operations=final_ops,
                                                   commit_message=f"{cfg.version}: card and manifest"),
                         cfg.retries, "final commit")
        head = info.oid
    else:
        head = api.repo_info(**repo, revision="main").sha
    _retrying(lambda: api.create_tag(**repo, tag=cfg.version, revision=head,
                                     tag_message=f"counterfactory {cfg.version}"),
              cfg.retries, "create_tag")
    log.info("published %s at %s (commit %s)", cfg.repo_id, cfg.version, head[:10])
    return PublishResult(cfg.repo_id, cfg.version, head, len(batches),
                         sum(len(b) for b in batches), skipped)
