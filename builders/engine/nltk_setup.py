"""NLTK data: the real tagger for normal use, an offline one for tests and the demo.

`nltk.pos_tag` needs `averaged_perceptron_tagger_eng`, which NLTK downloads from the internet.
Where that is impossible (CI, this project's tests), `install_offline_tagger(DIR)` trains NLTK's
own `PerceptronTagger` on the hand-tagged caption corpus shipped in `builders/engine/resources/` and
saves it where NLTK looks for the real one, so plain `nltk.pos_tag` works unchanged. It is a
small tagger for COCO-style captions, not a replacement for the real data: users with internet
run the download command in `DOWNLOAD_COMMAND`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from importlib import resources
from pathlib import Path

from builders.engine.errors import UserFacingError

# The check itself lives with the odmap metric Space, whose text mode needs the tagger too.
from counterfactory_metrics.odmap.noun_phrases import DOWNLOAD_COMMAND, TAGGER_DIR, TaggerDataMissing, ensure_tagger

log = logging.getLogger(__name__)

__all__ = [
    "DOWNLOAD_COMMAND",
    "TAGGER_DIR",
    "ensure_nltk_tagger",
    "install_offline_tagger",
    "read_tagged_corpus",
    "tagger_info",
]
CORPUS = "nltk_tagged_corpus.txt"
#: Written beside the tagger: which corpus trained it (lets a re-install skip unchanged data).
STAMP = "counterfactory_corpus.sha256"
TRAIN_ITERATIONS = 8
TRAIN_SEED = 0


def read_tagged_corpus() -> list[list[tuple[str, str]]]:
    text = resources.files("builders.engine.resources").joinpath(CORPUS).read_text(encoding="utf-8")
    sentences = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            sentences.append([tuple(tok.rsplit("/", 1)) for tok in line.split()])
    return sentences


def _corpus_digest() -> str:
    data = resources.files("builders.engine.resources").joinpath(CORPUS).read_bytes()
    return hashlib.sha256(data).hexdigest()


def default_nltk_data() -> Path:
    """Where the offline tagger goes: the first `$NLTK_DATA` folder, else where NLTK's downloader
    puts data (a folder on NLTK's default search path, usually ~/nltk_data)."""
    if os.environ.get("NLTK_DATA"):
        # NLTK_DATA may list several folders (like PATH); NLTK searches them in order.
        return Path(os.environ["NLTK_DATA"].split(os.pathsep)[0])
    from nltk.downloader import Downloader

    return Path(Downloader().default_download_dir())


def install_offline_tagger(nltk_data: str | Path) -> Path:
    """Train the offline tagger and save it under `nltk_data`; a no-op when already current, and
    when the real tagger is installed there (it is better: never replaced)."""
    from filelock import FileLock  # a dependency of huggingface_hub, torch and datasets

    nltk_data = Path(nltk_data).resolve()
    nltk_data.mkdir(parents=True, exist_ok=True)
    # Several processes may install at once (two test workers, the ranks of a job): one trains,
    # the others wait and find it current, never a half-written tagger.
    with FileLock(str(nltk_data / ".offline-tagger.lock")):
        return _install_offline_tagger(nltk_data)


def _install_offline_tagger(nltk_data: Path) -> Path:
    import nltk
    from nltk.tag.perceptron import PerceptronTagger

    target = nltk_data / TAGGER_DIR
    digest = _corpus_digest()
    stamp = target / STAMP
    if stamp.exists() and stamp.read_text().strip() == digest:
        return target
    if not stamp.exists() and any(target.glob("*.json")):
        log.info("the real NLTK tagger is already installed in %s; keeping it", target)
        return target
    # nltk 3.10 refuses to save outside its search path, and must find the tagger there later.
    if str(nltk_data) not in nltk.data.path:
        nltk.data.path.insert(0, str(nltk_data))
    target.mkdir(parents=True, exist_ok=True)
    tagger = PerceptronTagger(load=False)
    random.seed(TRAIN_SEED)  # PerceptronTagger.train shuffles with the global `random`
    tagger.train(read_tagged_corpus(), nr_iter=TRAIN_ITERATIONS)
    tagger.save_to_json(lang="eng", loc=str(target))
    stamp.write_text(digest + "\n")
    log.info("installed the offline caption tagger in %s", target)
    return target


def ensure_nltk_tagger() -> None:
    """Fail early, with the fix, when `nltk.pos_tag` has no tagger data (a one-line CLI error)."""
    try:
        ensure_tagger()
    except TaggerDataMissing as err:
        raise UserFacingError(
            f"{err}; offline, install the small caption tagger with `counterfactory nltk offline-tagger`"
        ) from None


def tagger_info() -> dict[str, str]:
    """Which tagger `nltk.pos_tag` will use, for build manifests."""
    import nltk

    ensure_nltk_tagger()
    path = Path(str(nltk.data.find(TAGGER_DIR + "/")))
    stamp = path / STAMP
    if stamp.exists():
        return {"tagger": "counterfactory offline caption tagger", "corpus_sha256": stamp.read_text().strip()}
    return {"tagger": "nltk averaged_perceptron_tagger_eng", "path": str(path)}
