"""What we publish cites papers only, and the code's `METHOD.md §N` citations resolve.

Published artefacts are read where users read them: dataset cards and manifests as pushed to the
(local) Hub by `counterfactory publish` after a small build of every registered builder, metric
Space files as pushed by `counterfactory publish-metric`, plus the raw card templates (every
branch of their conditionals) and the card text of every fill x caption x source variant of the
decorrelation card. None may mention the project-internal notes ("METHOD.md"), an outside
specification ("SPEC") or the outside background folder ("shared/"): a Hub reader cannot open
them. The code and the user documentation (README.md, docs/), in turn, cite
`builders/<dataset>/METHOD.md §N`; each such N must be a heading of that file, and they cite no
outside background notes ("ECOSYSTEM", "shared/") at all.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download

from builders.app.cli import main as cli_main
from builders.app.registry import BUILDER_MODULES

from helpers.reference_odmap import reference_odmap_from_rankings

REPO_ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = re.compile(r"\bSPEC\b|METHOD\.md|shared/")
#: Folders (and files) whose code or documentation may cite the notes (the citations must resolve).
CITING_DIRS = ("builders", "tests", "benchmarks", "training", "docs", "README.md")
#: A small build of each registered builder on the COCO fixture with the tiny models.
TINY = ["--models", "tiny"]
BUILD_ARGS = {
    "coco-captions": ["--splits", "test"],
    "decorrelation": [*TINY, "--image-size", "64", "--inpaint-steps", "2", "--max-images", "3"],
    "eccv-positives": ["--part-size", "8192"],  # its 5,000 test images in one part, not 625
    "coco-counterfactuals": [
        *TINY,
        "--karpathy-splits",
        "test",
        "--max-captions",
        "3",
        "--image-size",
        "64",
        "--steps",
        "2",
        "--candidates",
        "2",
        "--clip-threshold",
        "-1",
    ],
}
#: The paper each dataset card must cite in its BibTeX block.
CARD_BIBTEX_KEY = {
    "coco-captions": "lin2014microsoft",
    "decorrelation": "kim2023exposing",
    "coco-counterfactuals": "le2023cococounterfactuals",
    "eccv-positives": "chun2022eccv",
}


def forbidden_lines(text: str, where: str) -> list[str]:
    return [
        f"{where}:{n}: {line.strip()[:160]}" for n, line in enumerate(text.splitlines(), 1) if FORBIDDEN.search(line)
    ]


def test_the_check_catches_what_it_should():
    bad = ["see SPEC §2.5", "(builders/decorrelation/METHOD.md §1)", "../shared/papers/x.txt", "SPEC worked example"]
    good = ["Kim et al. 2023 §3.2", "special tokens", "SPECIAL_TOKENS", "shared noise", "specified"]
    assert all(forbidden_lines(t, "x") for t in bad)
    assert not any(forbidden_lines(t, "x") for t in good)


def test_card_templates_cite_papers_only():
    templates = sorted((REPO_ROOT / "dataset_cards").glob("*.md"))
    assert templates
    hits = [h for p in templates for h in forbidden_lines(p.read_text(encoding="utf-8"), p.name)]
    assert not hits, "card templates cite project-internal or outside documents:\n" + "\n".join(hits)


def test_every_decorrelation_card_variant_cites_papers_only(nltk_data_dir):
    from builders.decorrelation.card import card_fields
    from builders.decorrelation.config import (
        CAPTION_METHODS,
        FILL_METHODS,
        CaptionConfig,
        DecorrelationConfig,
        FillConfig,
        SourceConfig,
        VerifyConfig,
    )
    from builders.decorrelation.schema import COLUMN_DOCS

    seen = 0
    for kind, fill, caption, verify in itertools.product(
        ("coco", "flickr30k"), FILL_METHODS, CAPTION_METHODS, (False, True)
    ):
        cfg = DecorrelationConfig(
            source=SourceConfig(kind, Path("source")),
            fill=FillConfig(fill, model="inpaint-model"),
            caption=CaptionConfig(caption, model="captioner-model"),
            verify=VerifyConfig(enabled=verify, model="clip-model" if verify else None),
        )
        fields = card_fields(cfg, COLUMN_DOCS)
        text = json.dumps(fields, indent=1, ensure_ascii=False)
        hits = forbidden_lines(text, f"{kind}/{fill}/{caption}/verify={verify}")
        assert not hits, "\n".join(hits)
        assert "kim2023exposing" in fields["citation"]
        seen += 1
    assert seen == 2 * 2 * len(FILL_METHODS) * len(CAPTION_METHODS)


@pytest.fixture(scope="module")
def published(local_hub, coco_fixture_dir, tiny_models_dir, nltk_data_dir, tmp_path_factory):
    """name -> (build folder, Hub repo id): each registered builder built once and published."""
    root = tmp_path_factory.mktemp("citations")
    done: dict[str, tuple[Path, str]] = {}

    def get(name: str) -> tuple[Path, str]:
        if name not in done:
            out, repo = root / name, f"citations/{name}"
            extra = (
                [*BUILD_ARGS[name], "--tiny-models-dir", str(tiny_models_dir)]
                if "--models" in BUILD_ARGS[name]
                else BUILD_ARGS[name]
            )
            assert (
                cli_main(
                    [
                        "build",
                        name,
                        "--coco-root",
                        str(coco_fixture_dir),
                        "--output",
                        str(out),
                        "--part-size",
                        "8",
                        *extra,
                    ]
                )
                == 0
            )
            assert cli_main(["publish", str(out), "--repo-id", repo, "--version", "v1.0.0"]) == 0
            done[name] = (out, repo)
        return done[name]

    return get


def test_every_registered_builder_has_a_citation_check():
    assert set(BUILD_ARGS) == set(BUILDER_MODULES), (
        "add a small build of each new builder to BUILD_ARGS so its published card is checked"
    )


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(BUILD_ARGS))
def test_published_dataset_files_cite_papers_only(published, name):
    out, repo = published(name)
    files = [
        f
        for f in HfApi().list_repo_files(repo, repo_type="dataset", revision="v1.0.0")
        if not f.endswith((".parquet", ".png"))
    ]  # the card's figures are images, not text
    assert "README.md" in files and "build_manifest.json" in files
    hits = []
    for f in files:
        text = Path(hf_hub_download(repo, f, repo_type="dataset", revision="v1.0.0")).read_text(encoding="utf-8")
        hits += forbidden_lines(text, f"{repo}@v1.0.0/{f}")
    hits += forbidden_lines((out / "README.md").read_text(encoding="utf-8"), f"{out.name}/README.md")
    assert not hits, "published dataset files cite project-internal or outside documents:\n" + "\n".join(hits)
    card = Path(hf_hub_download(repo, "README.md", repo_type="dataset", revision="v1.0.0")).read_text(encoding="utf-8")
    bibtex = re.findall(r"```bibtex\n(.*?)```", card, flags=re.S)
    assert bibtex and CARD_BIBTEX_KEY[name] in bibtex[0], "the card must cite its paper in BibTeX"


@pytest.mark.slow
def test_decorrelation_card_recipe_runs_and_matches_a_brute_force_odmap(published, tiny_models_dir, capsys):
    """The card's ODmAP code block, run as published (tiny CLIP, local metric folder), prints the
    ODmAP@k of a brute force over the same ranking."""
    import numpy as np
    import torch
    from datasets import load_dataset

    out, repo = published("decorrelation")
    card = Path(hf_hub_download(repo, "README.md", repo_type="dataset", revision="v1.0.0")).read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", card, flags=re.S)[-1]
    assert "ORG/odmap" in code and "openai/clip-vit-base-patch32" in code
    code = code.replace("openai/clip-vit-base-patch32", str(tiny_models_dir / "clip")).replace(
        '"ORG/odmap"', repr(str(REPO_ROOT / "evaluate_modules" / "odmap"))
    )
    scope: dict = {}
    exec(compile(code, "card-recipe", "exec"), scope)  # the published text, not a copy of it
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    result = eval(printed, {"np": np})  # a printed dict of floats

    queries = load_dataset(repo, "odmap_queries", split="test", revision="v1.0.0")
    gallery = load_dataset(repo, "odmap_gallery", split="test", revision="v1.0.0")
    scores = scope["image_emb"] @ scope["text_emb"].T  # brute force: the full score matrix
    assert torch.equal(scope["topk"], scores.topk(min(10, scores.shape[1]), dim=1).indices) or torch.allclose(
        scores.gather(1, scope["topk"]), scores.topk(min(10, scores.shape[1]), dim=1).values
    )
    ranking = scope["topk"].tolist()
    ref = reference_odmap_from_rankings(
        ranking,
        [set(m) for m in gallery["mentioned_classes"]],
        [set(r) for r in queries["removed_classes"]],
        [set(p) for p in queries["present_classes"]],
        (1, 5, 10),
    )
    assert len(queries) > 0
    for k in (1, 5, 10):
        assert result[f"ODmAP@{k}"] == pytest.approx(ref[k])


@pytest.mark.slow
def test_published_metric_spaces_cite_papers_only(local_hub):
    modules = sorted(p for p in (REPO_ROOT / "evaluate_modules").iterdir() if (p / f"{p.name}.py").is_file())
    assert modules
    hits = []
    for module in modules:
        repo = f"citations/{module.name}"
        assert cli_main(["publish-metric", str(module), "--repo-id", repo, "--version", "v1.0.0"]) == 0
        for f in HfApi().list_repo_files(repo, repo_type="space", revision="v1.0.0"):
            path = Path(hf_hub_download(repo, f, repo_type="space", revision="v1.0.0"))
            hits += forbidden_lines(path.read_text(encoding="utf-8", errors="replace"), f"{repo}@v1.0.0/{f}")
    assert not hits, "metric Space files cite project-internal or outside documents:\n" + "\n".join(hits)


# ------------------------------------------------------------------ METHOD.md §N citations

CITATION = re.compile(r"(?:(builders/[\w/]+)/)?METHOD\.md`?((?:\s*§\d+(?:\s*`[^`]*`)?(?:\s*(?:,|/|and)\s*)?)*)")


#: Packages of `builders/` that are shared layers, not datasets (they have no METHOD.md notes).
SHARED_PACKAGES = {"engine", "models", "viewer", "publishing", "devtools", "app"}


def method_citations(text: str, source: Path) -> list[tuple[Path, int, int]]:
    """(notes file, section, line) for every `METHOD.md §N` in `text` (section 0: the file is
    named without a section). A bare `METHOD.md` refers to the notes of the dataset package
    `source` sits in; outside a dataset package it must come with a path, unless it names no
    section (a general mention such as "the METHOD.md notes of each package")."""
    out = []
    rel = source.relative_to(REPO_ROOT).parts
    package = (
        REPO_ROOT.joinpath(*rel[:2])
        if rel[0] == "builders" and len(rel) > 2 and rel[1] not in SHARED_PACKAGES
        else None
    )
    for m in CITATION.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        sections = [int(s) for s in re.findall(r"§(\d+)", m.group(2))]
        if m.group(1):
            notes = REPO_ROOT / m.group(1) / "METHOD.md"
        elif package:
            notes = package / "METHOD.md"
        elif sections:
            notes = REPO_ROOT / "METHOD.md"  # unresolvable: reported as a missing file
        else:
            continue
        out += [(notes, s, line) for s in sections] or [(notes, 0, line)]
    return out


def headings(notes: Path) -> set[int]:
    text = notes.read_text(encoding="utf-8")
    return {int(n) for n in re.findall(r"^## (?:§)?(\d+)\.?\s", text, flags=re.M)}


def unresolved(citations: list[tuple[Path, int, int]], source: str) -> list[str]:
    bad = []
    for notes, section, line in citations:
        if not notes.is_file():
            bad.append(f"{source}:{line}: {notes.relative_to(REPO_ROOT)} does not exist")
        elif section and section not in headings(notes):
            bad.append(f"{source}:{line}: {notes.relative_to(REPO_ROOT)} has no '## {section}.' heading")
    return bad


def test_the_citation_scanner_reads_lists_and_flags_missing_sections():
    src = REPO_ROOT / "builders" / "decorrelation" / "x.py"
    text = (
        "(builders/decorrelation/METHOD.md §3 `np_removal`, §5)\n"
        "builders/decorrelation/METHOD.md §4 / §5; paper §3.1\n"
        "see METHOD.md §2 beside this file\nbuilders/counterfactuals/METHOD.md §9\n"
        "builders/nowhere/METHOD.md §1"
    )
    cites = method_citations(text, src)
    dec, cf = REPO_ROOT / "builders/decorrelation/METHOD.md", REPO_ROOT / "builders/counterfactuals/METHOD.md"
    assert [(n, s) for n, s, _ in cites][:6] == [(dec, 3), (dec, 5), (dec, 4), (dec, 5), (dec, 2), (cf, 9)]
    bad = unresolved(cites, "x.py")
    assert len(bad) == 2 and "'## 9.'" in bad[0] and "does not exist" in bad[1]


def files_under(name: str) -> list[Path]:
    """The files of the folder REPO_ROOT/name, or that one file."""
    top = REPO_ROOT / name
    return [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())


def test_every_method_citation_resolves_to_a_heading():
    bad, count = [], 0
    docs = 0
    for folder in CITING_DIRS:
        for path in files_under(folder):
            # The --help snapshots are wrapped copies of the help texts, which are scanned in the code.
            if (
                path.suffix not in (".py", ".md", ".txt")
                or path.name == "METHOD.md"
                or "__pycache__" in path.parts
                or "snapshots" in path.parts
                or path == Path(__file__).resolve()
            ):
                continue
            cites = method_citations(path.read_text(encoding="utf-8"), path)
            count += len(cites)
            docs += len(cites) if path.parent.name == "docs" else 0
            bad += unresolved(cites, str(path.relative_to(REPO_ROOT)))
    assert count > 20, "the scanner found suspiciously few citations"
    assert docs > 5, "the scanner found suspiciously few citations in docs/"
    assert not bad, "\n".join(bad)


#: Code that may not cite the outside background notes: a reader of the repository cannot open
#: them, so the code states the fact itself (with its paper, documentation or observation).
CODE_DIRS = ("builders", "tests", "benchmarks", "training", "evaluate_modules", "loading_scripts", "docs", "README.md")
OUTSIDE_NOTES = re.compile(r"ECOSYSTEM|shared/")


def outside_note_lines(text: str, where: str) -> list[str]:
    return [
        f"{where}:{n}: {line.strip()[:160]}"
        for n, line in enumerate(text.splitlines(), 1)
        if OUTSIDE_NOTES.search(line)
    ]


def test_the_outside_note_check_catches_what_it_should():
    bad = ["(see ECOSYSTEM.md)", "# verified together (../shared/ECOSYSTEM.md)", "../shared/papers/x.txt"]
    good = ["accelerate 1.15.0's `simple_launcher`", "shared noise", "a shared helper", "ecosystem"]
    assert all(outside_note_lines(t, "x") for t in bad)
    assert not any(outside_note_lines(t, "x") for t in good)


def test_code_cites_no_outside_background_notes():
    paths = [REPO_ROOT / "pyproject.toml"]
    for folder in CODE_DIRS:
        paths += [p for p in files_under(folder) if "__pycache__" not in p.parts]
    assert len(paths) > 100, "the scan found suspiciously few files"
    hits = [
        h
        for p in paths
        if p != Path(__file__).resolve()
        for h in outside_note_lines(p.read_text(encoding="utf-8", errors="replace"), str(p.relative_to(REPO_ROOT)))
    ]
    assert not hits, "code cites outside background notes; state the fact instead:\n" + "\n".join(hits)


@pytest.mark.parametrize("notes", ["builders/decorrelation/METHOD.md", "builders/counterfactuals/METHOD.md"])
def test_method_notes_number_their_sections_and_cite_no_outside_document(notes):
    text = (REPO_ROOT / notes).read_text(encoding="utf-8")
    found = sorted(headings(REPO_ROOT / notes))
    assert found == list(range(1, len(found) + 1)) and len(found) >= 5
    assert not re.search(r"\bSPEC\b|shared/", text)
