"""The itm_score_deltas metric Space (see README.md); helpers import each other relatively."""
