"""Causal diagnosis over evidence: timeline, rules with confidence, summary (DESIGN §6)."""

from denpex.diagnosis.engine import DiagnosisInput, diagnose, signal_name

__all__ = ["DiagnosisInput", "diagnose", "signal_name"]
