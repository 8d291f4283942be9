"""Readers of raw sources (COCO, Flickr30k, ECCV annotations) as `datasets` builder classes called directly."""
