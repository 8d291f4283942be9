"""Models every stage shares: loading by id or local folder (`loaders`), the production and tiny
profiles (`profiles`), the tiny random-init models tests and the demo build (`tiny`), and the
CLIP embeddings used to score images against text (`clip`)."""
