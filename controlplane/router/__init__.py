"""The router: one leader session that batches events, talks to people and makes tickets."""
