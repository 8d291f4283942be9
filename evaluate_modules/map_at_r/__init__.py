"""The map_at_r metric Space (see README.md); helpers import each other relatively."""
