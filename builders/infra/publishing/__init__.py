"""Publishing builds and metric modules to a Hugging Face Hub endpoint.

- `card`: dataset cards rendered from build manifests.
- `publish`: uploads a build folder as a tagged, immutable dataset version.
- `metric`: uploads an evaluate module folder as a Space so `evaluate.load(repo_id)` works.
"""
