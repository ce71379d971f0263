"""Code every svc component shares.

``auth``: caller authentication (docs/auth.md); ``problems``: RFC 9457 problem details;
``topics``: topic names and the broker setting; ``settings``: helpers of the settings classes.
"""
