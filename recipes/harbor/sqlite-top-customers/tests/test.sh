#!/bin/bash
# The ranking is recomputed from the verifier's own copy of the data, not from the agent's database.
mkdir -p /logs/verifier
if python3 -I /tests/check_top.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
