"""How the harness reaches a host or pod: local, ssh, k8s, ray."""
