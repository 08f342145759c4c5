"""The console: the admins' web pages, served by every replica (docs/console.md).

Plain HTML shells (``pages``), one vanilla JS file and one CSS file (``static/``), no build
step. The pages fetch JSON from ``/console/api/…`` (the read functions of this package,
plain async functions over the database) and render it; a websocket (``hub``) tells open
pages when what they show has changed, so they refresh without a reload. Sign-in is every
surface's (``controlplane.access.middleware``): the admin token, or a session made from it.

The HTTP surface is ``controlplane.api.console``; nothing here decides anything for the
agent: the console reads the record and calls the same domain functions as the CLI.
"""
