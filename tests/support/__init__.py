"""What every tier of the suite shares: the servers (services), the databases, the deployments
of real processes (processes), the agents and the messages they exchange, and the credentials.
A tier imports its helpers from here, never from another tier."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_DEFINITIONS = ROOT / "tests" / "fixtures" / "definitions"
