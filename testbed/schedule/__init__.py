"""Pipeline schedules as data: the IR, its generators, and the registry of schedule names."""
