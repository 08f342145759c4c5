"""What every HTTP surface shares, below the routes themselves.

* :mod:`.state`: the application's state, which the API, the console, the metrics
  endpoint and each channel's webhook routes reach through ``Depends(app_state)``;
* :mod:`.headers`: the security headers of every HTML page (console and chat);
* :mod:`.static_files`: the pages' own scripts and style sheets.

Keeping them out of ``api/`` lets the channels sit below the API instead of importing it
back. Who may reach any of it is :mod:`controlplane.access`'s.
"""
