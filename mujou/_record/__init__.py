"""Record and replay: a run written to MCAP as it goes, read back, and replayed by tag."""
