"""Numbered schema versions of the policy service; only appended, never edited."""
