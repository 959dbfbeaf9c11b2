"""Agents: the SDK and the deterministic mock agents."""
