"""The HTTP surface: health, readiness, the console, and (later) the admin API.

Routes only open a session, call a domain function and translate errors; no domain logic
lives here.
"""
