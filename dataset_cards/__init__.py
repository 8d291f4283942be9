"""Dataset card templates rendered from build manifests."""
