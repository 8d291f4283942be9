"""What an eccv-positives build is asked to do (`EccvImportConfig`), and the constants of the
published annotations: the provenance labels, the MITL report's file name and the captions and
image the ECCV Caption paper removes (its Appendix C.1). Imports nothing else of the package."""

from __future__ import annotations

from dataclasses import dataclass

from builders.engine.option_types import non_negative_int
from builders.engine.options import option
from loading_scripts.image_metadata import strip_metadata_option
from loading_scripts.images import max_image_pixels_option

#: Provenance labels, most established first.
SOURCE_LABELS = ("coco", "cxc", "eccv")
#: File written next to the positives by `counterfactory eccv ingest` (counts and choices).
MITL_REPORT = "mitl_report.json"

# Chun et al., ECCV 2022, Appendix C.1: captions removed from the ECCV Caption test split
# (18 meaningless, 14 semantically wrong) and the test image duplicated in the training set.
MEANINGLESS_CAPTIONS = {
    607516: "The first picture is blank all the time on purpose.",
    607486: "Why is my first one a blank every time.",
    433639: "There is no image here to provide a caption for.",
    248212: "I am unable to see an image above.",
    469834: "There is no image here to provide a caption for.",
    462530: "I really cant see this image very well.",
    469102: "There is no image to be reviewed on this hit.",
    743575: "There is no image showing on this page to describe.",
    246706: "I am unable to see an image above.",
    61717: "There is no picture here to describe with a caption.",
    500797: "I am unable to see the image above.",
    19273: "There is no image for me to write about.",
    630298: "There is no image to provide a caption for.",
    576409: "I am unable to see the image above.",
    390637: "I am unable to see an image above.",
    296557: "There is no image here to provide a caption for.",
    450553: "I am unable to see an image above.",
    44809: "blank image with no pictures available to write about",
}
WRONG_CAPTIONS = {
    610564: "An individual is in the open view in the image.",
    359139: "I cant tell if the bears may be fighting or kissing.",
    218995: "A baseball player hugging another player as lovers do.",
    609235: "Individuals are up and doing something fun today.",
    143250: "The bar of the small bathroom has many remotes on it.",
    375316: "A photo duplicated a few times and put together.",
    712683: "Talk about a bad hair day, his is frightful.",
    75083: "A group of birds flying above the beach.",
    625605: "It is always wise to have bottles of water on hand in case of an emergency.",
    620511: "If the motorcycle brakes down, the bicycle will be good transportation.",
    613949: "A full view of an outdoor space with many things to see.",
    129825: "A picture of a comment that is open.",
    605566: "There is a room with various items in the picture.",
    634829: "That thing is really red and slow lol",
}
DUPLICATE_IMAGES = {
    578492: "COCO_val2014_000000578492.jpg duplicates COCO_train2014_000000388662.jpg and "
    "COCO_train2014_000000397819.jpg",
}
INVALID_CAPTION_IDS = frozenset(MEANINGLESS_CAPTIONS) | frozenset(WRONG_CAPTIONS)


@dataclass
class EccvImportConfig:
    """Example: `EccvImportConfig(coco_root="coco", pm_zeta=0)`."""

    #: COCO download for images, caption texts and instances (PM); None: ids only, no PM.
    coco_root: str | None = option(
        None,
        "COCO download for images, caption texts and instances (optional: without it rows "
        "hold ids only and there is no pm config)",
    )
    #: Folder with `{eccv,cxc,original}_{image_to_caption,caption_to_image}.json`; None: the
    #: files shipped in the installed `eccv_caption` package (the published ECCV Caption).
    annotations_dir: str | None = option(
        None,
        "folder of positives in the eccv_caption file format (default: the installed "
        "eccv_caption package; `counterfactory eccv ingest` writes one)",
    )
    #: PM pseudo-positives: images whose 80-class instance vectors differ in <= zeta classes.
    pm_zeta: int = option(0, "PM: max number of differing instance classes (paper PMRP: 0)", type=non_negative_int)
    #: Compute the `pm` config (needs `coco_root` with instances of the test images).
    with_pm: bool = option(True, "skip the pm config", flag="--no-pm")
    #: Skip (count `image_too_large`) images of more pixels, checked before decoding.
    max_image_pixels: int = max_image_pixels_option()
    #: Drop the source images' EXIF (GPS included), XMP and comments, losslessly (their bytes
    #: are stored as read otherwise: `loading_scripts/images.py`).
    strip_metadata: bool = strip_metadata_option()
