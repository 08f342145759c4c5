"""Coding-agent CLIs ("harnesses") run by a worker on a developer's device."""
