"""Machinery of the test suite itself (not fixtures, not fakes): see each module."""
