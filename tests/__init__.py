"""Unit tests of Mujou's private modules (the conformance suite tests the public API)."""
