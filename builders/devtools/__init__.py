"""Tools for developing and testing counterfactory without the internet: the local Hub server
(`local_hub`, `local_hub_requests`), the tiny fixtures (`fixtures/`) and the production check
(`doctor`, `doctor_models`, `doctor_stages`: `counterfactory doctor`)."""
