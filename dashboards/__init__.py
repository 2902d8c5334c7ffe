"""The Flask status page, Grafana dashboards and Prometheus rules."""
