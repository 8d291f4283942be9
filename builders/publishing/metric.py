"""Publish a metric Space folder (`evaluate_modules/NAME`) as a tagged Hub Space for `evaluate.load`.

`evaluate.load("ORG/NAME")` downloads `NAME.py` from the Space `ORG/NAME` and, for each relative
import at the top of `NAME.py` (`from .helper import x`), `helper.py` from the same Space. It does
not follow the helpers' own imports, and it refuses absolute imports of packages that are not
installed. So a Space is self-contained when `NAME.py` imports every helper the helpers need and
everything else comes from PyPI (`requirements.txt`). `space_files` checks exactly that before
anything is uploaded and lists what to upload: `NAME.py`, its helpers, `README.md`,
`requirements.txt` (and `app.py`; the standard evaluate widget app is added when there is none).
As in evaluate's own metric Spaces, the card's front matter must declare `sdk: gradio`, an
`sdk_version` and `app_file: app.py`: the upload replaces the card that `create_repo` wrote, and a
card without them leaves the Space with no app to build. The package markers (`__init__.py`) that make the folder importable in the project are not
uploaded: the uploaded files are byte for byte the ones the project imports. Nothing else in the
folder is sent (no dotfile, no `__pycache__`, no stray file), and each file sent must be a regular
file of the folder: a symlink is refused, naming it, since it could send a file from anywhere on
this machine (so a helper used by two Spaces is a file in each). Tags are immutable, as for
datasets.
"""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from builders.engine.errors import UserFacingError
from builders.publishing.hub_client import retrying
from builders.publishing.publish import refuse_existing_tag
from builders.publishing.target import HubTarget

log = logging.getLogger(__name__)

# evaluate's widget app, loading NAME.py from the Space's own folder (not by repo id): the app runs
# exactly the files its Space holds, also in a duplicated Space and without reaching the Hub.
APP = """import os

import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "{name}.py"))
launch_gradio_widget(module)
"""
# What the card's front matter must declare for the Hub to build and start the app.
CARD_KEYS = {"sdk": "gradio", "sdk_version": None, "app_file": "app.py"}


@dataclass
class MetricPublishConfig(HubTarget):
    """What to publish (a module folder) where (a Space whose NAME equals the module file's stem,
    `NAME.py`). Example: `MetricPublishConfig("org/odmap", "v1.0.0", module_dir=Path(
    "evaluate_modules/odmap"))`."""

    module_dir: Path = field(kw_only=True)


def _relative_imports(path: Path, top_level_only: bool) -> dict[str, int]:
    """Helper module name -> line of each `from .helper import ...` in `path`."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as err:
        raise UserFacingError(
            f"{path}:{getattr(err, 'lineno', 0) or 1}: not valid Python "
            f"({type(err).__name__}); fix the module before publishing it"
        ) from None
    nodes = tree.body if top_level_only else ast.walk(tree)
    found: dict[str, int] = {}
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.level != 1 or not node.module:
                raise UserFacingError(
                    f"{path}:{node.lineno}: only `from .helper import name` "
                    "works in a metric Space (evaluate downloads helper.py)"
                )
            found.setdefault(node.module, node.lineno)
    return found


def space_files(module_dir: Path, name: str) -> list[Path]:
    """The files of the Space NAME (checked self-contained, see the module docstring)."""
    module_dir = Path(module_dir)
    script = module_dir / f"{name}.py"
    if not script.is_file():
        found = (
            sorted(p.name for p in module_dir.glob("*.py") if p.name != "__init__.py") if module_dir.is_dir() else []
        )
        raise UserFacingError(
            f"{script} does not exist: evaluate.load('ORG/{name}') fetches {name}.py, so the "
            f"repo name must match the module file (found {found or 'no .py files'} in {module_dir})"
        )
    _own_files(module_dir, [script])  # before anything is read through a link
    helpers = _relative_imports(script, top_level_only=True)
    nested = set(_relative_imports(script, top_level_only=False)) - set(helpers)
    if nested:
        raise UserFacingError(
            f"{script} imports .{sorted(nested)[0]} inside a function: evaluate "
            "downloads only helpers imported at the top of the file; move the "
            "import there"
        )
    paths = {helper: module_dir / f"{helper}.py" for helper in sorted(helpers)}
    for helper, path in paths.items():
        if not path.is_file():
            raise UserFacingError(
                f"{script}:{helpers[helper]} imports .{helper}, but {path} does "
                "not exist (a helper shared with another Space: copy it here)"
            )
    extras = [
        module_dir / extra
        for extra in ("README.md", "requirements.txt", "app.py")
        if (module_dir / extra).is_file() or (module_dir / extra).is_symlink()
    ]
    files = _own_files(module_dir, [script, *paths.values(), *extras])
    if (module_dir / "README.md").is_file():
        _check_card(module_dir / "README.md")
    for path in files[1 : len(paths) + 1]:
        for needed, needed_line in _relative_imports(path, top_level_only=False).items():
            if needed not in helpers:
                raise UserFacingError(
                    f"{path}:{needed_line} imports .{needed}, which {name}.py does not import: "
                    f"evaluate.load downloads only the helpers {name}.py imports — add "
                    f"`from .{needed} import ...` to {name}.py"
                )
    return files


def _check_card(card: Path) -> None:
    """The card's YAML front matter declares the Space's app (`CARD_KEYS`), or one line says what
    to add. (Without a card, the one `create_repo(space_sdk="gradio")` wrote stays.)"""
    text = card.read_text(encoding="utf-8", errors="replace")
    meta = {}
    if text.startswith("---\n") and "\n---" in text[4:]:
        try:
            meta = yaml.safe_load(text[4 : text.index("\n---", 3)]) or {}
        except yaml.YAMLError as err:
            raise UserFacingError(
                f"{card}: the front matter is not valid YAML ({err.__class__.__name__}); fix it before publishing"
            ) from None
    meta = meta if isinstance(meta, dict) else {}
    wrong = [
        f"{key}: {want or '<gradio version>'}"
        for key, want in CARD_KEYS.items()
        if meta.get(key) is None or (want is not None and meta.get(key) != want)
    ]
    if wrong:
        raise UserFacingError(
            f"{card}: the front matter lacks {', '.join(wrong)}: a Space's card must declare its "
            "app (the upload replaces the Hub's card) — add them between the leading --- lines, "
            "as in evaluate_modules/odmap/README.md"
        )


def _own_files(module_dir: Path, files: list[Path]) -> list[Path]:
    """`files`, each checked to be a regular file of the folder itself (no symlink anywhere)."""
    root = module_dir.resolve()
    links = [p.name for p in files if p.is_symlink() or p.resolve() != root / p.name]
    if links:
        raise UserFacingError(
            f"{module_dir}: {', '.join(links)}: a symlink; a Space publishes "
            "only regular files of its own folder (a link could send a file from "
            "anywhere on this machine) — replace each link by a copy of the file"
        )
    return [root / p.name for p in files]


def publish_metric(cfg: MetricPublishConfig) -> str:
    """Upload the Space's files (`space_files`) and tag them; returns the tagged commit."""
    from huggingface_hub import HfApi

    module_dir = Path(cfg.module_dir)
    cfg.check()
    name = cfg.repo_id.split("/")[-1]
    files = space_files(module_dir, name)
    with cfg.session("re-run the same command") as endpoint:
        return _upload_and_tag(HfApi(endpoint=endpoint), cfg, module_dir, name, files)


def _upload_and_tag(api, cfg: MetricPublishConfig, module_dir: Path, name: str, files: list[Path]) -> str:
    from huggingface_hub import CommitOperationAdd

    repo = dict(repo_id=cfg.repo_id, repo_type="space")
    # One attempt each (no back-off here), but a broken answer is one line naming the request.
    retrying(lambda: api.create_repo(**repo, space_sdk="gradio", private=cfg.private, exist_ok=True), 1, "create_repo")
    refuse_existing_tag(api, repo, cfg.version, retries=1)
    ops = [CommitOperationAdd(path_in_repo=p.name, path_or_fileobj=p.read_bytes()) for p in files]
    if not (module_dir / "app.py").exists():
        ops.append(CommitOperationAdd(path_in_repo="app.py", path_or_fileobj=APP.format(name=name).encode()))
    commit = retrying(
        lambda: api.create_commit(**repo, operations=ops, commit_message=f"{name} {cfg.version}").oid,
        1,
        "create_commit",
    )
    retrying(lambda: api.create_tag(**repo, tag=cfg.version, revision=commit), 1, "create_tag")
    log.info("published metric %s at %s (commit %s)", cfg.repo_id, cfg.version, commit[:10])
    return commit
