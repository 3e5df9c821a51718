"""Foundations: what every other layer uses and that knows nothing of the rest.

The error classes (``errors``: every one of the package), atomic writes and reading JSON (``atomic``),
blocking HTTP (``http``), a job's log (``logs``), the schema's defaults and the client's typed settings
(``settings``), the machine and the checkout a result comes from (``host``), numbers as text (``fmt``) and a
document as blocks with its markdown and HTML renderers (``table``).
"""
