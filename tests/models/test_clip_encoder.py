"""The one CLIP encoder: both backends give normalised float32 embeddings through the same calls,
the id parser reads every spelling the annotators and the trainer accept, one place picks the device."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from builders.engine.distributed import worker_device
from builders.models.clip import ClipScorer, OpenClipScorer, features, load_scorer
from builders.models.clip_ids import OPEN_CLIP, TRANSFORMERS, ClipId, ClipIdError, parse_clip_id
from builders.models.profiles import resolve_profile

#: (id, backend given, expected): the annotators infer the backend from the id, the trainer names it.
SPELLINGS = [
    (
        "openai/clip-vit-base-patch32",
        None,
        ClipId(TRANSFORMERS, "openai/clip-vit-base-patch32", "openai/clip-vit-base-patch32"),
    ),
    ("runs/x/final", None, ClipId(TRANSFORMERS, "runs/x/final", "runs/x/final")),
    ("open_clip:ViT-B-32:openai", None, ClipId(OPEN_CLIP, "ViT-B-32:openai", "ViT-B-32", "openai")),
    ("open_clip:ViT-B-32", None, ClipId(OPEN_CLIP, "ViT-B-32", "ViT-B-32")),
    ("open_clip:ViT-B-32:ckpt.pt", None, ClipId(OPEN_CLIP, "ViT-B-32:ckpt.pt", "ViT-B-32", "ckpt.pt")),
    ("open_clip:local-dir:m", None, ClipId(OPEN_CLIP, "local-dir:m", "local-dir:m")),
    ("hf-hub:timm/vit", None, ClipId(OPEN_CLIP, "hf-hub:timm/vit", "hf-hub:timm/vit")),
    ("local-dir:m", None, ClipId(OPEN_CLIP, "local-dir:m", "local-dir:m")),
    ("ViT-B-32:openai", OPEN_CLIP, ClipId(OPEN_CLIP, "ViT-B-32:openai", "ViT-B-32", "openai")),
    ("ViT-B-32", OPEN_CLIP, ClipId(OPEN_CLIP, "ViT-B-32", "ViT-B-32")),
    ("hf-hub:timm/vit", OPEN_CLIP, ClipId(OPEN_CLIP, "hf-hub:timm/vit", "hf-hub:timm/vit")),
    ("local-dir:m", OPEN_CLIP, ClipId(OPEN_CLIP, "local-dir:m", "local-dir:m")),
    # The trainer's --backend names the implementation: its ids carry no `open_clip:` prefix.
    (
        "open_clip:ViT-B-32:openai",
        OPEN_CLIP,
        ClipId(OPEN_CLIP, "open_clip:ViT-B-32:openai", "open_clip", "ViT-B-32:openai"),
    ),
    (
        "openai/clip-vit-base-patch32",
        TRANSFORMERS,
        ClipId(TRANSFORMERS, "openai/clip-vit-base-patch32", "openai/clip-vit-base-patch32"),
    ),
    ("hf-hub:timm/vit", TRANSFORMERS, ClipId(TRANSFORMERS, "hf-hub:timm/vit", "hf-hub:timm/vit")),
]


@pytest.mark.parametrize("model_id, backend, expected", SPELLINGS)
def test_the_parser_reads_every_spelling(model_id, backend, expected):
    assert parse_clip_id(model_id, backend) == expected


def test_a_folder_is_open_clips_local_dir_only_where_open_clip_is_named(tmp_path):
    folder = str(tmp_path)
    assert parse_clip_id(folder, OPEN_CLIP) == ClipId(OPEN_CLIP, folder, f"local-dir:{folder}")
    assert parse_clip_id(f"open_clip:{folder}") == ClipId(OPEN_CLIP, folder, f"local-dir:{folder}")
    assert parse_clip_id(folder) == ClipId(TRANSFORMERS, folder, folder)
    with pytest.raises(ValueError, match="unknown CLIP backend"):
        parse_clip_id(folder, "timm")


@pytest.mark.parametrize(
    "model_id, backend",
    [
        ("", None),
        ("", TRANSFORMERS),
        ("open_clip:", None),
        ("hf-hub:", None),
        ("open_clip:local-dir:", None),
        ("", OPEN_CLIP),
        (":openai", OPEN_CLIP),
        ("hf-hub: ", OPEN_CLIP),
        ("local-dir:", OPEN_CLIP),
    ],
)
def test_an_id_naming_no_model_is_refused_by_the_parser(model_id, backend):
    """Never a load of '' (the working folder) or of an empty architecture, repo or folder."""
    with pytest.raises(ClipIdError, match="names no model; give .*ARCH\\[:TAG\\]"):
        parse_clip_id(model_id, backend)


def test_the_trainers_pretrained_tag_goes_with_an_architecture_name_only(tmp_path):
    """`--model ViT-B-32 --pretrained openai` is one typed value, shown as the architecture with
    its tag; beside an id that names its weights the tag is refused, never dropped."""
    clip = parse_clip_id("ViT-B-32", OPEN_CLIP, "openai")
    assert clip == ClipId(OPEN_CLIP, "ViT-B-32", "ViT-B-32", "openai") and clip.label == "ViT-B-32:openai"
    assert parse_clip_id("hf-hub:timm/vit", OPEN_CLIP).label == "hf-hub:timm/vit"
    for named in ("ViT-B-32:openai", "hf-hub:timm/vit", "local-dir:m", str(tmp_path)):
        with pytest.raises(ClipIdError, match="already says which weights to load, so --pretrained laion"):
            parse_clip_id(named, OPEN_CLIP, "laion")


def test_features_reads_a_tensor_or_a_model_output():
    t = torch.ones(2, 3)
    assert features(t) is t
    assert features(SimpleNamespace(pooler_output=t)) is t


@pytest.fixture(scope="module")
def tiny(tiny_models_dir):
    return resolve_profile("tiny", tiny_models_dir)


@pytest.mark.parametrize("role, kind", [("clip", ClipScorer), ("open_clip", OpenClipScorer)])
@pytest.mark.slow
def test_both_backends_give_normalised_float32_embeddings(tiny, role, kind):
    scorer = load_scorer(getattr(tiny, role))
    assert isinstance(scorer, kind)
    texts = scorer.texts(["a cat", "two dogs on the grass", "a cat"])
    images = scorer.images([Image.new("RGB", (128, 96), c) for c in ("red", "blue")])
    assert texts.dtype == images.dtype == torch.float32
    assert texts.shape[0] == 3 and images.shape[0] == 2 and texts.shape[1] == images.shape[1]
    torch.testing.assert_close(texts.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(images.norm(dim=-1), torch.ones(2))
    torch.testing.assert_close(texts[0], texts[2])  # padding to the longest may move the last bits


def test_the_transformers_scorer_is_the_models_own_projection(tiny):
    scorer = load_scorer(tiny.clip)
    enc = scorer.processor(text=["a cat"], return_tensors="pt", padding=True, truncation=True)
    with torch.no_grad():
        own = features(scorer.model.get_text_features(**enc))
    assert torch.equal(scorer.texts(["a cat"]), torch.nn.functional.normalize(own.float(), dim=-1))


def test_one_place_picks_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert worker_device() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert worker_device() == "cuda:3"
    monkeypatch.delenv("LOCAL_RANK")
    assert worker_device() == "cuda:0"
