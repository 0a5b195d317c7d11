"""denpex: reliability for AI training jobs.

Layer 0 (`denpex run`, `denpex scan`) reads what a job prints and names the root cause of a
failure from evidence. See DESIGN.md for the layers; this package never imports a layer
above the one a module belongs to.
"""

__version__ = "0.1.0"
