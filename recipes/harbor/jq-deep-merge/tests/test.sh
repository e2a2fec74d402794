#!/bin/bash
# The merge is recomputed from the verifier's own copies of base.json and prod.json.
mkdir -p /logs/verifier
if python3 -I /tests/check_merge.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
