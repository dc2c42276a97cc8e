"""Writes this process's environment to env-rank<RANK>.json in the working directory: a program with no
testbed in mind, used to compare what testbed gives a program with what torchrun gives it."""
import json
import os

with open(f"env-rank{os.environ['RANK']}.json", "w") as f:
    json.dump(dict(os.environ), f)
