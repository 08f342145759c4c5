"""Test doubles shared by the test suite (fake external services)."""
