"""Deploying packages where engines run: publish to a remote, install per device, export for a serving runtime."""
