"""The object store fixtures of tests/objects (a real SeaweedFS, no ambient AWS settings),
for the offload tests too."""

from tests.objects.conftest import (  # noqa: F401 (fixtures, found by name)
    no_ambient_aws,
    seaweedfs,
    start_seaweedfs,
)
