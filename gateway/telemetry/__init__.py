"""What the gateway says about itself: Prometheus metrics, traces and logs, recent-window figures."""
