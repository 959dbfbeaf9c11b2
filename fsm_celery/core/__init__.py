"""The pure core: definitions, wire messages and the transition decision. No I/O here."""
