"""Who each of this host's fabric ports is cabled to: InfiniBand peers from infiniband-diags
(ibdiags.py: `ibnetdiscover`, `iblinkinfo`), Ethernet/RoCE peers from lldpd (lldp.py:
`lldpcli -f json0 show neighbors`), and the collector that runs them (collector.py)."""
