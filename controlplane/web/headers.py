"""The security headers every HTML page of the control plane sends (console and chat)."""

from __future__ import annotations

# The pages load only their own script and style, and only this site may frame them (the
# console frames the chat page, which links back to it).
CSP = (
    "default-src 'self'; frame-ancestors 'self'; base-uri 'none'; form-action 'self'; "
    "object-src 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "SAMEORIGIN",  # frame-ancestors for browsers that predate CSP 2
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
