"""Stage 2 of a MITL round: package candidate pairs into verification tasks (METHOD.md §3).

A task holds 20 image-caption pairs of one modality: 18 candidates, 1 golden positive (an
original COCO pair) and 1 golden negative (a sampled query paired with an item in no model's
top-`exclusion_depth`, and not one of its original pairs), shuffled with a per-task seed so the
goldens cannot be spotted by position. Candidates are shuffled once (seeded) before being cut
into tasks, so a task mixes queries; the last task is topped up with candidates from the first
ones (those pairs get a second verdict).

Writes to the output folder: `tasks.json` (what `ingest` checks verdicts against),
`label_studio_tasks.json` + `label_config.xml` (Label Studio import: one task per pair, carrying
`task_id`/`item_id`, the machine proposal as a prediction), and `tasks.csv` (the same pairs with
empty `worker_id`/`answer` columns to fill in).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from builders.eccv_positives.mitl.candidates import MODALITIES, Candidates
from builders.engine.errors import InputFileError, UserFacingError

log = logging.getLogger(__name__)

#: The paper's four answers (Appendix B.1), strongest first.
ANSWERS = ("100% YES", "Partially YES, but", "Mostly NO, because", "100% NO")
CANDIDATES_PER_TASK = 18
TASKS_FORMAT = "counterfactory-eccv-tasks/1"
LABEL_CONFIG = """<View>
  <Header value="Is the image correctly described by the text?"/>
  <Image name="image" value="$image"/>
  <Text name="text" value="$text"/>
  <Choices name="answer" toName="text" choice="single" required="true">
    <Choice value="100% YES"/>
    <Choice value="Partially YES, but"/>
    <Choice value="Mostly NO, because"/>
    <Choice value="100% NO"/>
  </Choices>
</View>
"""


@dataclass
class TasksConfig:
    """Example: `TasksConfig(candidates="run/candidates.json", output="run/tasks", seed=0)`."""

    candidates: str
    output: str
    seed: int = 0
    #: Image reference in the exports: a template with {file} (path under the COCO root),
    #: {file_name} and {image_id} (a dataset gallery has only ids); ignored with `embed_thumbnails`.
    image_url_template: str = "/data/local-files/?d={file}"
    #: Embed JPEG thumbnails as data: URIs instead of URLs (self-contained exports).
    embed_thumbnails: bool = False
    thumbnail_size: int = 256


def _golden_positive(cands: Candidates, modality: str, rng: random.Random) -> tuple[int, int]:
    g = cands.gallery
    n = rng.randrange(len(g.caption_ids))
    caption, image = g.caption_ids[n], g.caption_image_ids[n]
    return (image, caption) if modality == "i2t" else (caption, image)


def _golden_negative(cands: Candidates, modality: str, rng: random.Random) -> tuple[int, int]:
    g = cands.gallery
    items = g.caption_ids if modality == "i2t" else g.image_ids
    queries = list(cands.queries[modality])
    # Rejection sampling: the excluded items are a tiny part of a real gallery.
    for _ in range(1000):
        query, item = rng.choice(queries), rng.choice(items)
        pair_image, pair_caption = (query, item) if modality == "i2t" else (item, query)
        if item not in cands.exclude[modality][str(query)] and g.caption_image[pair_caption] != pair_image:
            return query, item
    raise UserFacingError(
        f"no golden negative for {modality}: every gallery item drawn was in some "
        f"model's top-{cands.config['exclusion_depth']} (or an original pair) of "
        "the sampled queries; use a larger gallery or a smaller --exclusion-depth"
    )


def build_tasks(cands: Candidates, seed: int) -> list[dict[str, Any]]:
    """Tasks of 18 candidates + 1 golden positive + 1 golden negative, deterministic in `seed`."""
    tasks = []
    for modality in MODALITIES:
        pool = [c for c in cands.candidates if c["modality"] == modality]
        if not pool:
            continue
        if len(pool) < CANDIDATES_PER_TASK:
            raise UserFacingError(
                f"only {len(pool)} {modality} candidates, a task needs {CANDIDATES_PER_TASK}; sample more queries"
            )
        random.Random(f"{seed}:{modality}").shuffle(pool)
        n_tasks = -(-len(pool) // CANDIDATES_PER_TASK)
        padded = pool + pool[: n_tasks * CANDIDATES_PER_TASK - len(pool)]
        for t in range(n_tasks):
            task_id = f"{modality}-{t:05d}"
            rng = random.Random(f"{seed}:{task_id}")
            entries = [
                {"kind": "candidate", "query_id": c["query_id"], "item": c["item_id"], "proposed_by": c["proposed_by"]}
                for c in padded[t * CANDIDATES_PER_TASK : (t + 1) * CANDIDATES_PER_TASK]
            ]
            for kind, pick in (("golden_positive", _golden_positive), ("golden_negative", _golden_negative)):
                query, item = pick(cands, modality, rng)
                entries.append({"kind": kind, "query_id": query, "item": item, "proposed_by": {}})
            rng.shuffle(entries)
            items = []
            for pos, e in enumerate(entries):
                image, caption = (e["query_id"], e["item"]) if modality == "i2t" else (e["item"], e["query_id"])
                items.append(
                    {
                        "item_id": f"{task_id}-{pos:02d}",
                        "kind": e["kind"],
                        "modality": modality,
                        "query_id": e["query_id"],
                        "image_id": image,
                        "caption_id": caption,
                        "proposed_by": e["proposed_by"],
                    }
                )
            tasks.append({"task_id": task_id, "modality": modality, "items": items})
    return tasks


def _image_refs(cands: Candidates, cfg: TasksConfig, used: set[int]) -> dict[int, str]:
    """URL or embedded thumbnail of every image the tasks show (only those: a gallery may be huge)."""
    g = cands.gallery
    refs = {}
    for n, (image_id, file) in enumerate(zip(g.image_ids, g.image_files, strict=True)):
        if image_id not in used:
            continue
        if cfg.embed_thumbnails:
            image = g.open_image(n)
            image.thumbnail((cfg.thumbnail_size, cfg.thumbnail_size))
            buf = io.BytesIO()
            image.save(buf, format="JPEG", quality=85)
            refs[image_id] = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
        else:
            refs[image_id] = cfg.image_url_template.format(file=file, file_name=Path(file).name, image_id=image_id)
    return refs


def write_tasks(cfg: TasksConfig) -> Path:
    """Build the tasks of `cfg.candidates` and write every export into `cfg.output`."""
    cands = Candidates.load(Path(cfg.candidates))
    tasks = build_tasks(cands, cfg.seed)
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    texts = dict(zip(cands.gallery.caption_ids, cands.gallery.captions, strict=True))
    refs = _image_refs(cands, cfg, {i["image_id"] for t in tasks for i in t["items"]})
    # The candidates path is stored absolute: ingest reads it again from any working folder.
    manifest = {
        "format": TASKS_FORMAT,
        "config": {**asdict(cfg), "candidates": str(Path(cfg.candidates).resolve())},
        "candidates_config": cands.config,
        "gallery_root": str(cands.gallery.root),
        "queries": cands.queries,
        "candidate_pairs": len(cands.candidates),
        "answers": list(ANSWERS),
        "tasks": tasks,
    }
    (out / "tasks.json").write_text(json.dumps(manifest, indent=1))
    studio = []
    for task in tasks:
        for item in task["items"]:
            studio.append(
                {
                    "data": {
                        "task_id": task["task_id"],
                        "item_id": item["item_id"],
                        "image": refs[item["image_id"]],
                        "text": texts[item["caption_id"]],
                    },
                    # The machine proposal, shown to annotators as a pre-selected answer; goldens get
                    # the same one so they cannot be told apart.
                    "predictions": [
                        {
                            "model_version": "machine-annotators",
                            "result": [
                                {
                                    "from_name": "answer",
                                    "to_name": "text",
                                    "type": "choices",
                                    "value": {"choices": [ANSWERS[0]]},
                                }
                            ],
                        }
                    ],
                }
            )
    (out / "label_studio_tasks.json").write_text(json.dumps(studio, indent=1))
    (out / "label_config.xml").write_text(LABEL_CONFIG)
    with open(out / "tasks.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["task_id", "item_id", "image", "text", "worker_id", "answer"])
        for task in tasks:
            for item in task["items"]:
                writer.writerow(
                    [task["task_id"], item["item_id"], refs[item["image_id"]], texts[item["caption_id"]], "", ""]
                )
    log.info("wrote %d tasks (%d pairs) to %s", len(tasks), 20 * len(tasks), out)
    return out


def load_tasks(path: Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "tasks.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise InputFileError(
            path, f"cannot read the tasks file ({err})", "pass the tasks.json written by `counterfactory eccv tasks`"
        ) from err
    if not isinstance(data, dict) or data.get("format") != TASKS_FORMAT:
        raise InputFileError(path, "is not a tasks file", "pass the tasks.json written by `counterfactory eccv tasks`")
    return data
