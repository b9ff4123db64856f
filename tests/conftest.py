import sys
from pathlib import Path

# Test helpers (golden_cases, mount fixtures) live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Hypothesis judges nothing by time here: no deadline per example, and no health check
# failing a test because generating its data was slow (a busy machine is slow).
try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the tests that use it skip or fail on their own
    pass
else:
    settings.register_profile("mmfs", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("mmfs")
