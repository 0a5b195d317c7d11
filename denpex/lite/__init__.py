"""Layer 0, denpex lite: wrap or scan a job's output and diagnose it (DESIGN §4).

The runner passes every byte through untouched; analysis (line stream, scanner, host
evidence, reports) happens beside it and may fall behind, but never slows the job.
"""
