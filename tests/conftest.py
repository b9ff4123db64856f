import sys
from pathlib import Path

# Test helpers (golden_cases, mount fixtures) live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))
