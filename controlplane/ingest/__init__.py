"""Ingest: events become Triggers, judged by admission (the programmatic filter), then routed."""
