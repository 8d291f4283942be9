"""The odmap metric Space (see README.md); helpers import each other relatively."""
