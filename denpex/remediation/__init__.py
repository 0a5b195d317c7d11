"""Layer 5: remediation. The state machine (a table), the plans derived from incidents, the
policy tiers and guards, and the backends that act on a scheduler or a cluster.

It must never act without a policy that allows it: the default tier only records.
"""
