"""Replay buffers (per-member and shared layouts)."""
