"""Row schemas of the object-decorrelation products, and what each column means (for the card).

Three tables (README `configs:`):

- `default` / `train`: D', the synthetic training pairs (x', y') from the Karpathy train
  (+restval) split, one row per (removal, synthetic caption).
- `odmap_queries` / `test`: the ODmAP@k queries, one row per removal in the test split.
- `odmap_gallery` / `test`: the ODmAP@k gallery, one row per caption of train+restval+val+test,
  with its class-mention vector (columns = the build's `class_names`).
"""

from __future__ import annotations

import datasets

from loading_scripts.images import STORED_AS

_BOXES = datasets.List(
    {"category": datasets.Value("string"), "bbox": datasets.List(datasets.Value("float32"), length=4)}
)

#: Columns shared by D' rows and ODmAP queries (the synthetic image and how it was made).
_EDIT = {
    "image_id": datasets.Value("int64"),
    "source_split": datasets.Value("string"),
    "image": datasets.Image(),
    "removed_classes": datasets.List(datasets.Value("string")),
    "present_classes": datasets.List(datasets.Value("string")),
    "anchor_class": datasets.Value("string"),
    "removal": datasets.Value("string"),
    "removed_boxes": _BOXES,
    "mask": datasets.Image(),
    "region_fraction": datasets.Value("float32"),
    "fill": datasets.Value("string"),
    "fill_model": datasets.Value("string"),
    "seed": datasets.Value("int64"),
    "visibility_before": datasets.List(datasets.Value("float32")),
    "visibility_after": datasets.List(datasets.Value("float32")),
}


def train_features(keep_original: bool) -> datasets.Features:
    cols = {
        "row_id": datasets.Value("string"),
        **_EDIT,
        "caption": datasets.Value("string"),
        "caption_id": datasets.Value("int64"),
        "original_caption": datasets.Value("string"),
        "caption_method": datasets.Value("string"),
        "caption_model": datasets.Value("string"),
    }
    if keep_original:
        cols["original_image"] = datasets.Image()
    return datasets.Features(cols)


def query_features(keep_original: bool) -> datasets.Features:
    cols = {"query_id": datasets.Value("string"), **_EDIT, "caption_ids": datasets.List(datasets.Value("int64"))}
    if keep_original:
        cols["original_image"] = datasets.Image()
    return datasets.Features(cols)


def gallery_features(n_classes: int) -> datasets.Features:
    return datasets.Features(
        {
            "caption_id": datasets.Value("int64"),
            "image_id": datasets.Value("int64"),
            "source_split": datasets.Value("string"),
            "caption": datasets.Value("string"),
            "mentions": datasets.List(datasets.Value("bool"), length=n_classes),
            "mentioned_classes": datasets.List(datasets.Value("string")),
        }
    )


COLUMN_DOCS = {
    "row_id": "unique id `IMAGE_ID/ANCHOR_CLASS/K` (K = index of the synthetic caption)",
    "query_id": "unique id `IMAGE_ID/ANCHOR_CLASS`",
    "image_id": "source image id (COCO image id / Flickr30k image number)",
    "source_split": "Karpathy split of the source image",
    "image": "the synthetic image x' (PNG; same size as the source image)",
    "original_image": f"the source image x (only with `--keep-original`): {STORED_AS}",
    "removed_classes": "classes removed from the image (sorted)",
    "present_classes": "classes still in the image (sorted, never empty)",
    "anchor_class": "the class c^r whose removal was tried (Kim et al. 2023 §3.1)",
    "removal": "`single` (only c^r) or `multi` (c^r plus classes overlapping it by > alpha2)",
    "removed_boxes": "source boxes of the removed classes, COCO (x, y, w, h) pixels as annotated",
    "mask": "filled region: L-mode PNG, 255 = replaced (every pixel the removed boxes touch, grown "
    "by `mask_dilation` px on every side, clipped to the image)",
    "region_fraction": "area of the removed boxes (touched pixels, not dilated) / image area: the "
    "quantity the alpha3 rule tests",
    "fill": "how the region was filled: inpaint, zero, mean or blur",
    "fill_model": "inpainting model id (null for the zero/mean/blur baselines)",
    "seed": "per-row seed (derived from the run seed, image id and anchor class)",
    "visibility_before": "removal check: CLIP zero-shot probability of each removed class (order of "
    "`removed_classes`) on the source view; null when the check was off",
    "visibility_after": "the same on the synthetic image; every value is below the card's threshold",
    "caption": "synthetic caption y' (D') / gallery caption text (gallery)",
    "caption_id": "id of the original caption y' was made from (np_removal; null otherwise) / gallery caption id",
    "original_caption": "the original caption y' was made from (np_removal; null otherwise)",
    "caption_method": "np_removal, prompts or captioner",
    "caption_model": "captioning model id (captioner; null otherwise)",
    "caption_ids": "caption ids of the source image (its original captions)",
    "mentions": "per class of `class_names` (column order): a noun phrase of the caption matches it",
    "mentioned_classes": "the classes the caption mentions (same information, by name)",
}
