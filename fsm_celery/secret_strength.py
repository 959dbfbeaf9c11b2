"""Whether a secret is random bytes or something a person typed (pure, no I/O).

Every threshold is chosen never to refuse a generated secret: 32 random hex characters
(secrets.token_hex(16), the shortest accepted) have fewer than 8 different characters with
probability 3.5e-8, one character in more than half of them 1.2e-11; half their 30 trigrams
repeated, or fewer than 8 different steps between neighbours, far less (tests/unit/
test_secret_strength.py draws thousands of each generator's). A typed secret repeats itself
(`'Password1' * 4`) or steps through a sequence (`'0123456789abcdef...'`).
"""

from __future__ import annotations

from itertools import pairwise

MIN_DISTINCT_CHARACTERS = 8
MIN_DISTINCT_STEPS = 8  # differences between neighbouring characters' code points
GRAM = 3  # a secret whose trigrams are more than half repeats is a shorter pattern repeated


def weak_secret(secret: str, min_bytes: int = 0) -> str | None:
    """Why a secret is guessable ("is shorter than 32 bytes", ...), or None."""
    if len(secret.encode()) < min_bytes:
        return f"is shorter than {min_bytes} bytes"
    if len(set(secret)) < MIN_DISTINCT_CHARACTERS:
        return f"has fewer than {MIN_DISTINCT_CHARACTERS} different characters (a pattern)"
    if 2 * max(secret.count(c) for c in set(secret)) > len(secret):
        return "is more than half one character repeated"
    if _repeats(secret):
        return "repeats a shorter pattern (as 'Password1' * 4 does)"
    if len(_steps(secret)) < MIN_DISTINCT_STEPS:
        return "steps through a sequence (as '0123456789abcdef...' does)"
    return None


def _repeats(secret: str) -> bool:
    """Whether more than half of the secret's trigrams are repeats of earlier ones."""
    grams = [secret[i : i + GRAM] for i in range(len(secret) - GRAM + 1)]
    return 2 * len(set(grams)) < len(grams)


def _steps(secret: str) -> set[int]:
    return {ord(b) - ord(a) for a, b in pairwise(secret)}
