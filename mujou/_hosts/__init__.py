"""Groups of a run's processes placed on other hosts (the "Several machines" page of the spec)."""
