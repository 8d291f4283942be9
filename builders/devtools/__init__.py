"""Tools for developing and testing counterfactory without the internet: the local Hub server
(`local_hub`, `local_hub_requests`) and the tiny COCO-format fixture (`fixtures/`)."""
