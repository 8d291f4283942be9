"""Dataset-card fields of an object-decorrelation build (rendered by `dataset_cards/decorrelation.md`).

Everything that a reader needs to judge or rebuild a version: the rules and thresholds, the fill
and caption methods with their models and prompt, the class list of the mention vectors, the
documented choices where the paper is silent, and the limitations.
"""

from __future__ import annotations

from typing import Any

CITATION = """@inproceedings{kim2023exposing,
  title     = {Exposing and Mitigating Spurious Correlations for Cross-Modal Retrieval},
  author    = {Kim, Jae Myung and Koepke, A. Sophia and Schmid, Cordelia and Akata, Zeynep},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR) Workshops},
  year      = {2023}
}"""


def _how_built(cfg: Any) -> list[str]:
    sel, fill, cap = cfg.selection, cfg.fill, cfg.caption
    fill_text = {
        "inpaint": f'diffusion inpainting with `{fill.model}` (prompt "{fill.prompt}", {fill.steps} '
        f"steps, guidance {fill.guidance_scale}, working resolution {fill.image_size}x"
        f"{fill.image_size}; only masked pixels are replaced)",
        "zero": "zero fill (removed pixels set to black)",
        "mean": "mean fill (removed pixels set to the region's mean colour)",
        "blur": f"Gaussian blur of radius {fill.blur_radius} px inside the removed region",
    }[fill.method]
    cap_text = {
        "np_removal": "noun-phrase removal: the noun phrases of an original caption that match a "
        "removed class are deleted (NLTK chunking + the paper's COCO matching table; "
        "Flickr30k: the Entities phrases of a removed type); captions are tried in a "
        "seeded random order and one that mentions no removed class is not used",
        "prompts": 'prompts: one of the 80 CLIP ImageNet templates, filled with the present classes joined by " and "',
        "captioner": f"captioner: `{cap.model}` run on x' (greedy decoding; the paper used ClipCap)",
    }[cap.method]
    return [
        f"Source: {cfg.source.kind} at Karpathy splits; D' from {list(cfg.train_splits)}, ODmAP "
        f"queries from `{cfg.query_split}`, gallery captions from {list(cfg.gallery_splits)}.",
        f"Selection (Kim et al. 2023, §3.1 and App. C): images with >= {sel.min_classes} classes; "
        f"for each class c^r, masks are unions of boxes covering every pixel they touch; skip if "
        f"area(B^r)/area(x) > alpha3 = {sel.alpha3}; single-class removal if every other class "
        f"overlaps B^r by < alpha1 = {sel.alpha1}; else multi-class removal of c^r and every class "
        f"overlapping > alpha2 = {sel.alpha2} (the union must also pass alpha3); else skipped. "
        "Removals that leave no class are skipped; boxes without pixels are dropped.",
        f"Image synthesis (Kim et al. 2023, §3.1; baselines §4.4): {fill_text}. The filled region "
        f"(`mask`) is the removed boxes grown by {fill.mask_dilation} px on every side (square "
        "dilation, clipped), as inpainting practice grows masks so box edges and colour bleed "
        "around a tight box are replaced too; the selection rules use the undilated boxes.",
        _verify_text(cfg.verify),
        f"Caption synthesis (Kim et al. 2023, §3.3; D' only): {cap_text}; "
        f"{cap.captions_per_image} caption(s) per synthetic image, each a row.",
        "Gallery mentions (Kim et al. 2023, §3.2 and App. A): `mentions[c]` is true when a noun "
        "phrase of the caption matches class c (COCO: NLTK noun phrases + the paper's Table 4, "
        "whole words, simple and irregular plurals; Flickr30k: Entities types).",
        f"Seeds: run seed {cfg.seed}; each row's seed is derive_seed(run seed, image id, anchor "
        "class), so rows do not depend on process count, part size or resumes.",
    ]


def _precision_text(cfg: Any, precision: dict[str, str] | None) -> list[str]:
    if precision is None:
        return []
    models = [
        name
        for name, used in (("inpainting", cfg.fill.method == "inpaint"), ("the removal check", cfg.verify.enabled))
        if used
    ]
    ran = f"{' and '.join(models)} in {precision['dtype']}, " if models else ""
    return [
        f"Precision: models ran on {precision['device']}, {ran}the captioner in fp32 "
        "(`--dtype`; another precision or device type gives other pixels from the same seeds)."
    ]


def _verify_text(verify: Any) -> str:
    if not verify.enabled:
        return (
            "Removal check: off. Nothing verifies that a removed object is gone from x' "
            "(diffusion inpainting can redraw it)."
        )
    view = (
        f"a square crop around the filled region (plus {verify.context:g} of its longer side on each side)"
        if verify.view == "region"
        else "the whole image"
    )
    prompt = verify.prompt.format("{class}")
    return (
        f"Removal check (not in the paper): CLIP `{verify.model}` scores {view} of x and of x' "
        f'zero-shot against "{prompt}" (softmax over all classes); a candidate whose removed '
        f"class still has probability >= {verify.threshold} on x' is skipped as "
        "`object_still_visible` (counted below). Both probabilities are kept per row "
        "(`visibility_before`, `visibility_after`)."
    )


def card_fields(cfg: Any, column_docs: dict[str, str], precision: dict[str, str] | None = None) -> dict[str, Any]:
    """`BuildInfo.card_fields` for a `DecorrelationConfig`; `precision` as the manifest records it."""
    coco = cfg.source.kind == "coco"
    fields: dict[str, Any] = {
        "license": "cc-by-4.0" if coco else "other",
        "task_categories": ["image-to-text", "text-to-image"],
        "tags": ["object-removal", "spurious-correlations", "odmap", "inpainting", cfg.source.kind],
        "source_datasets": ["MS-COCO" if coco else "Flickr30k"],
        "summary": "Object-decorrelation sets after Kim et al. (CVPR-W 2023): images from which "
        "object classes were removed (x') with synthetic captions (y') for debiasing "
        "image-text retrieval, and the ODmAP@k evaluation set (object-removal queries "
        "from the test split plus a caption gallery with class-mention vectors).",
        "column_docs": column_docs,
        "how_built": _how_built(cfg) + _precision_text(cfg, precision),
        "class_names": list(cfg.source.class_names),
        "fill": cfg.fill.method,
        "limitations": [
            "The paper inpainted with a GAN; this build uses diffusion inpainting (or a baseline "
            "fill), so textures differ from the paper's data.",
            "Masks are boxes, not object outlines: background inside a box is regenerated too, and "
            "parts of a removed object outside its box (or an unannotated instance) remain.",
            "Correctness of captions and gallery mentions is judged from noun phrases and a word "
            'list, not by people; tagger errors and over-broad related words ("board", '
            '"screen") change both.',
            'Noun-phrase removal can leave ungrammatical captions ("Two dogs fighting over"), as in the paper.',
            "Images keep the license terms of their sources (COCO: Flickr terms of use).",
        ],
        "citation": CITATION,
    }
    if not coco:
        fields["limitations"].append(
            "The paper used 4 Flickr30k classes without naming them; this build treats the Flickr30k "
            f"Entities types {', '.join(cfg.source.class_names)} as the object classes."
        )
    if coco and ("odmap" in cfg.products or cfg.caption.method == "np_removal"):
        from builders.engine.nltk_setup import tagger_info

        fields["nltk_tagger"] = tagger_info()
    return fields
