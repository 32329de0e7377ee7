"""Event sources of the railhop agent: eBPF (bcc), netlink, sysfs counters, verbs async events,
the plugin's USDT probes. See docs/probes.md."""
