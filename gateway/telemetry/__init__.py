"""What the gateway says about itself: the recorder of requests and jobs, traces and logs, the recent window.

The Prometheus series it writes are declared in gateway/series/."""
