"""Postgres: connections, the embedded server, the schema and its migrations.

Everything that matters lives here, so any replica may die at any moment
(docs/architecture.md, *Rules everything relies on*, rule 4).
"""
