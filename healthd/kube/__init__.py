"""Thin helpers over the official kubernetes client."""
