"""Publishing builds and metric modules to a Hugging Face Hub endpoint.

- `card`: dataset cards rendered from build manifests; `write_card` finishes a build (the
  `finish` step `run_build` calls: figures, manifest, card).
- `target`: the repo, version tag and Hub settings both kinds of publishing share.
- `publish`: uploads a build folder as a tagged, immutable dataset version.
- `hub_client`: endpoint set-up, bounded requests, back-off, one-line Hub errors.
- `metric`: uploads an evaluate module folder as a Space so `evaluate.load(repo_id)` works.
"""
