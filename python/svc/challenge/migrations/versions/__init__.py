"""Numbered schema versions of the challenge service; only appended, never edited."""
