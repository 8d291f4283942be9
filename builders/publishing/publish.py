"""Publish a build folder to the Hub as an immutable, tagged version.

Uploads go in several commits of bounded size (large pushes are where users hit timeouts and
429s), each skipped when the Hub already holds identical bytes, so re-running after an
interruption finishes the same version without re-committing unchanged shards. The last commit
writes the card and manifest and deletes shards of older versions that this one no longer has;
then the tag is created on exactly that commit. An existing tag is never moved.

Concurrent publishes cannot mix: every commit names its parent (the Hub refuses it with 412 when
main moved), and after tagging, the tagged tree is compared file by file (LFS sha256 / git blob
id) with this build. A rerun that finds the tag already holding exactly this build succeeds
without uploading; one that finds other content fails. An empty build is never published.

Only the build's own files are sent: those `build_manifest.json` lists (each checked to be a
regular file inside the folder with the recorded size and sha256), the card and the manifest. A
folder that holds anything else (a symlink, a dotfile, a stray file) is refused before anything is
uploaded, naming them (see `sharding.build_files`).

The token comes from the environment or `huggingface_hub` login; nothing here writes it anywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from builders.engine.errors import PublishError, UserFacingError
from builders.publishing.hub_client import check_answer, retrying
from builders.publishing.target import HubTarget
from builders.engine.sharding.build_files import CARD, changed_since_build, check_published_files, read_chunks
from builders.engine.sharding.layout import MANIFEST, OutputLayout

log = logging.getLogger(__name__)

_COMMIT_ID = re.compile(r"[0-9a-f]{40}", re.ASCII)


@dataclass
class PublishConfig(HubTarget):
    """What to publish (a build folder) where (a dataset repo)."""

    output_dir: Path = field(kw_only=True)
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
    #: True when the tag already held exactly this build (a rerun after an interrupted publish).
    already_published: bool = False


def git_blob_oid(data: bytes) -> str:
    """The git object id of a file's bytes (what the Hub reports for non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def refuse_existing_tag(api, repo: dict, version: str, retries: int) -> None:
    """Tags are immutable: fail, naming the tagged commit, when `version` is already a tag."""
    tags = _tags(api, repo, retries)
    if version in tags:
        raise UserFacingError(
            f"{repo['repo_id']} already has tag {version} (commit {tags[version][:10]}); "
            "tags are never moved — publish under a new version, e.g. bump the patch number"
        )


def _check_build(output_dir: Path) -> dict:
    from builders.engine.sharding.output_guard import build_in_progress

    if build_in_progress(OutputLayout(output_dir)):
        raise PublishError(f"a build is still writing to {output_dir}; publish it once the build has finished")
    manifest_path = output_dir / MANIFEST
    if not manifest_path.exists() or manifest_path.is_symlink():
        raise UserFacingError(
            f"{manifest_path} is missing (or a symlink): {output_dir} is not a finished "
            "counterfactory build (run or resume the build first)"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        rows = [out["rows"] for out in manifest["outputs"].values()]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserFacingError(
            f"{manifest_path} is damaged ({type(err).__name__}: {err}); re-run the build command to write it again"
        ) from None
    if not any(rows):
        # An empty version would load as nothing (or, without explicit configs, as the manifest).
        reasons = {**manifest.get("skipped", {}), **manifest.get("errors", {})}
        raise PublishError(
            f"{output_dir} has no rows in any output ({manifest.get('items', 0)} items; skipped: "
            f"{reasons or 'none'}); an empty build is never published — check the inputs and the "
            "build options"
        )
    return manifest


def publish(cfg: PublishConfig) -> PublishResult:
    """Upload the build in `cfg.output_dir` and tag it `cfg.version` (see the module docstring)."""
    cfg.check()
    output_dir = Path(cfg.output_dir).resolve()
    manifest = _check_build(output_dir)
    # Every local check (and hash) before the first request: a refused folder uploads nothing.
    files = _version_files(output_dir, manifest, cfg)
    with cfg.session(
        f"re-run the same command to finish {cfg.version} (uploaded shards are not sent again)"
    ) as endpoint:
        return _publish(cfg, files, endpoint)


@dataclass(frozen=True)
class _Local:
    """A file of the version: where its bytes come from and the hashes the Hub reports."""

    source: Path | bytes
    sha256: str
    git_oid: str

    @classmethod
    def of(cls, source: Path | bytes) -> "_Local":
        size = source.stat().st_size if isinstance(source, Path) else len(source)
        sha, git = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
        chunks = [source] if isinstance(source, bytes) else read_chunks(source)
        for chunk in chunks:
            sha.update(chunk)
            git.update(chunk)
        return cls(source, sha.hexdigest(), git.hexdigest())

    def same_as(self, entry) -> bool:
        """Whether a Hub tree entry holds exactly these bytes (LFS sha256, else git blob id)."""
        if entry.lfs is not None:
            return entry.lfs.sha256 == self.sha256
        return entry.blob_id == self.git_oid


def _version_files(output_dir: Path, manifest: dict, cfg: PublishConfig) -> dict[str, _Local]:
    """Every file of the published version, as it must be on the Hub (the listed files verified)."""
    from builders.publishing.card import render_card

    files = {}
    for path, record in check_published_files(output_dir, manifest).items():
        files[path] = _Local.of(output_dir / path)
        if files[path].sha256 != record.get("sha256"):
            raise changed_since_build(output_dir / path)
    # The card is re-rendered for this repo and version; the local README is the unreleased one.
    files[CARD] = _Local.of(render_card(manifest, repo_id=cfg.repo_id, version=cfg.version).encode())
    files[MANIFEST] = _Local.of((output_dir / MANIFEST).read_bytes())
    return files


def _tree(api, repo: dict, revision: str, retries: int) -> dict:
    entries = retrying(
        lambda: list(api.list_repo_tree(**repo, recursive=True, revision=revision)),
        retries,
        f"list_repo_tree {revision}",
    )
    return {f.path: f for f in entries if hasattr(f, "blob_id") and f.path != ".gitattributes"}


def _differences(tree: dict, files: dict[str, _Local]) -> list[str]:
    """How a Hub tree differs from the version's files (empty when it is exactly this build)."""
    out = [f"{p} is missing" for p in sorted(set(files) - set(tree))]
    out += [f"{p} is not part of this build" for p in sorted(set(tree) - set(files))]
    out += [f"{p} has other content" for p in sorted(set(files) & set(tree)) if not files[p].same_as(tree[p])]
    return out


def _publish(cfg: PublishConfig, files: dict[str, _Local], endpoint: str) -> PublishResult:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    api = HfApi(endpoint=endpoint)
    repo = dict(repo_id=cfg.repo_id, repo_type="dataset")
    retrying(lambda: api.create_repo(**repo, private=cfg.private, exist_ok=True), cfg.retries, "create_repo")

    tagged = _tags(api, repo, cfg.retries).get(cfg.version)
    if tagged is not None:
        return _already_tagged(api, repo, cfg, files, tagged)

    # Every commit names its parent: if another publish commits to main in between, the Hub
    # answers 412 and this one stops, so two builds' files never interleave in one version.
    head = retrying(lambda: _commit_id(api.repo_info(**repo, revision="main").sha), cfg.retries, "repo_info")
    remote = _tree(api, repo, head, cfg.retries)

    # Data files first, in bounded commits; README + manifest + deletions last, so a version's
    # card never describes shards that are not there yet.
    final = (CARD, MANIFEST)
    batches: list[list[tuple[str, _Local]]] = [[]]
    batch_bytes = 0
    skipped = 0
    for path, local in files.items():
        if path in final:
            continue
        if path in remote and local.same_as(remote[path]):
            skipped += 1
            continue
        size = local.source.stat().st_size
        if batches[-1] and (batch_bytes + size > cfg.max_commit_bytes or len(batches[-1]) >= cfg.max_commit_files):
            batches.append([])
            batch_bytes = 0
        batches[-1].append((path, local))
        batch_bytes += size
    batches = [b for b in batches if b]

    for i, batch in enumerate(batches, 1):
        ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(local.source)) for p, local in batch]
        head = _commit(api, repo, cfg, ops, head, f"{cfg.version}: data {i}/{len(batches)}")
        log.info("uploaded data commit %d/%d (%d files)", i, len(batches), len(batch))

    final_ops: list = [
        CommitOperationAdd(path_in_repo=p, path_or_fileobj=files[p].source)
        for p in final
        if not (p in remote and files[p].same_as(remote[p]))
    ]
    final_ops += [CommitOperationDelete(path_in_repo=p) for p in sorted(remote) if p not in files]
    if final_ops:
        head = _commit(api, repo, cfg, final_ops, head, f"{cfg.version}: card and manifest")
    _tag(api, repo, cfg, files, head)
    log.info("published %s at %s (commit %s)", cfg.repo_id, cfg.version, head[:10])
    return PublishResult(cfg.repo_id, cfg.version, head, len(batches), sum(len(b) for b in batches), skipped)


def _commit(api, repo: dict, cfg: PublishConfig, ops: list, parent: str, message: str) -> str:
    return retrying(
        lambda: _commit_id(
            api.create_commit(**repo, operations=ops, commit_message=message, parent_commit=parent).oid
        ),
        cfg.retries,
        message,
    )


def _commit_id(value) -> str:
    """A commit id from a Hub answer, which must be one (it becomes the next commit's parent)."""
    check_answer(
        isinstance(value, str) and bool(_COMMIT_ID.fullmatch(value)), f"expected a commit id, got {str(value)[:60]!r}"
    )
    return value


def _tags(api, repo: dict, retries: int) -> dict[str, str]:
    refs = retrying(lambda: api.list_repo_refs(**repo), retries, "list_repo_refs")
    return {t.name: t.target_commit for t in refs.tags}


def _already_tagged(api, repo: dict, cfg: PublishConfig, files: dict[str, _Local], commit: str) -> PublishResult:
    """A rerun after the tag was made: fine when the tag holds exactly this build."""
    diff = _differences(_tree(api, repo, commit, cfg.retries), files)
    if diff:
        raise PublishError(
            f"{cfg.repo_id} already has tag {cfg.version} (commit {commit[:10]}) with other content "
            f"({diff[0]}); tags are never moved — publish under a new version, e.g. bump the "
            "patch number"
        )
    log.info(
        "%s@%s already holds exactly this build (commit %s); nothing to do", cfg.repo_id, cfg.version, commit[:10]
    )
    return PublishResult(cfg.repo_id, cfg.version, commit, 0, 0, len(files), already_published=True)


def _tag(api, repo: dict, cfg: PublishConfig, files: dict[str, _Local], head: str) -> None:
    """Tag `head`, then check the tag names exactly this build's files."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        retrying(
            lambda: api.create_tag(
                **repo, tag=cfg.version, revision=head, tag_message=f"counterfactory {cfg.version}"
            ),
            cfg.retries,
            "create_tag",
        )
    except HfHubHTTPError as err:
        if err.response is None or err.response.status_code != 409:
            raise
        log.warning("tag %s appeared while publishing (another publish?); checking it", cfg.version)
    tagged = _tags(api, repo, cfg.retries).get(cfg.version)
    diff = _differences(_tree(api, repo, tagged or head, cfg.retries), files)
    if tagged is None or diff:
        raise PublishError(
            f"tag {cfg.version} of {cfg.repo_id} does not hold exactly this build "
            f"({diff[0] if diff else 'the tag is missing'}); another publish to the same repo and "
            "version interleaved with this one — check the tagged files, and publish this build "
            "under a new version"
        )
