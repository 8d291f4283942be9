"""Readers of raw sources: `coco` and `flickr30k` return `records.SourceImage` (paths, sizes,
captions, boxes; no pixels), `eccv` the ECCV Caption / CxC / COCO / PM positives, and `images`
turns a source image into RGB pixels or a counted reason."""
