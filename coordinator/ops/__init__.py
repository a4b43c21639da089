"""Operating the daemon: metrics, the console, consumer lag, the data-cluster reader, stall, GC and
loop-lag watchers, systemd notify. Never imported by the core."""
