"""Publish an `evaluate` module folder as a tagged Hub Space, so users can `evaluate.load` it.

`evaluate.load("ORG/NAME")` downloads `NAME.py` from the Space `ORG/NAME`, so the folder must hold
`NAME.py` for the repo's NAME. A Space also needs an app; the standard evaluate widget app is
added when the folder has none. Tags are immutable, as for datasets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from builders.infra.errors import UserFacingError
from builders.infra.publishing.publish import check_version, refuse_existing_tag

log = logging.getLogger(__name__)

APP = '''import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load("{repo_id}")
launch_gradio_widget(module)
'''


@dataclass
class MetricPublishConfig:
    """Example: `MetricPublishConfig(Path("evaluate_modules/odmap"), "org/odmap", "v1.0.0")`."""

    module_dir: Path
    #: `ORG/NAME`; NAME must equal the module file's stem (`NAME.py`).
    repo_id: str
    version: str
    endpoint: str | None = None
    private: bool = False


def publish_metric(cfg: MetricPublishConfig) -> str:
    """Upload the module and tag it; returns the tagged commit."""
    from huggingface_hub import CommitOperationAdd, HfApi

    module_dir = Path(cfg.module_dir)
    check_version(cfg.version)
    name = cfg.repo_id.split("/")[-1]
    script = module_dir / f"{name}.py"
    if not script.is_file():
        found = sorted(p.name for p in module_dir.glob("*.py")) if module_dir.is_dir() else []
        raise UserFacingError(
            f"{script} does not exist: evaluate.load('{cfg.repo_id}') fetches {name}.py, so the "
            f"repo name must match the module file (found {found or 'no .py files'} in {module_dir})")
    api = HfApi(endpoint=cfg.endpoint)
    repo = dict(repo_id=cfg.repo_id, repo_type="space")
    api.create_repo(**repo, space_sdk="gradio", private=cfg.private, exist_ok=True)
    refuse_existing_tag(api, repo, cfg.version, retries=1)
    ops = [CommitOperationAdd(path_in_repo=p.relative_to(module_dir).as_posix(), path_or_fileobj=str(p))
           for p in sorted(module_dir.rglob("*"))
           if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    if not (module_dir / "app.py").exists():
        ops.append(CommitOperationAdd(path_in_repo="app.py",
                                      path_or_fileobj=APP.format(repo_id=cfg.repo_id).encode()))
    info = api.create_commit(**repo, operations=ops, commit_message=f"{name} {cfg.version}")
    api.create_tag(**repo, tag=cfg.version, revision=info.oid)
    log.info("published metric %s at %s (commit %s)", cfg.repo_id, cfg.version, info.oid[:10])
    return info.oid
