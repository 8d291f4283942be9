"""Models every stage shares: loading by id or local folder (`loaders`), the production and tiny
profiles (`profiles`), the tiny random-init models tests and the demo build (`tiny`), which CLIP
implementation an id names (`clip_ids`: transformers or open_clip) and the CLIP embeddings every
stage, the MITL tools and the trainer read (`clip`)."""
