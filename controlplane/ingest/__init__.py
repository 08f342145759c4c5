"""Ingest: events become Triggers, judged by the programmatic policy, then routed."""
