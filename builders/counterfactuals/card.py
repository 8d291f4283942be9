"""The card fields of a COCO-Counterfactuals build. The datasheet prose (motivation, collection,
filtering, uses) is in the card template; these are the fields the shared card machinery reads."""

from __future__ import annotations

from builders.counterfactuals.schema import COLUMN_DOCS

CARD_FIELDS = {
    "license": "cc-by-4.0",
    "task_categories": ["image-to-text", "text-to-image", "zero-shot-image-classification"],
    "tags": ["counterfactuals", "coco", "synthetic", "stable-diffusion", "prompt-to-prompt"],
    "source_datasets": ["MS-COCO"],
    "summary": "Counterfactual image-text pairs: each original COCO caption gets a counterfactual "
    "caption with one noun swapped, and Stable Diffusion with Prompt-to-Prompt draws a "
    "pair of images that differ only where the captions differ.",
    "column_docs": COLUMN_DOCS,
    "limitations": [
        "Images are synthetic (Stable Diffusion) and inherit its failure modes and social biases.",
        "Automatic filtering leaves errors: both captions may fit an image (hyponym swaps such as "
        "girl -> kid), or an image may miss its subject; swaps of people (`human_substitution`) "
        "had a 44% error rate in the paper's human study (27% overall).",
        "Only nouns are swapped; verbs, attributes and counts are never changed.",
    ],
    "citation": "@inproceedings{le2023cococounterfactuals, title={COCO-Counterfactuals: "
    "Automatically Constructed Counterfactual Examples for Image-Text Pairs}, "
    "author={Le, Tiep and Lal, Vasudev and Howard, Phillip}, booktitle={NeurIPS "
    "Datasets and Benchmarks Track}, year={2023}}",
}
