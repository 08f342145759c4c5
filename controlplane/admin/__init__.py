"""What the admin commands do, once, for both ways of reaching it: ``superagent`` on the
database, and the HTTP API (``POST /console/api/ops/{name}``) that a CLI with a context, or
any script, calls. Each operation takes validated parameters and the caller (who acts), and
answers JSON: the CLI renders that answer whichever way it came."""
