"""What every HTTP route shares, below the routes themselves: the application's state.

The API, the console, the metrics endpoint and each channel's webhook routes all reach it
through ``Depends(app_state)``; keeping it out of ``api/`` lets the channels sit below the
API instead of importing it back.
"""
