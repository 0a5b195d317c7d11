"""The control plane's web UI: server-rendered pages (Jinja2, htmx vendored under static/)
mounted on the FastAPI app of `denpex server` at `/`.

It reads tenant data only through the same authenticate → authorize → Store.scoped path as
the REST API, and must never load anything from outside the package (air-gapped first).
"""

from denpex.control.ui.routes import mount_ui

__all__ = ["mount_ui"]
