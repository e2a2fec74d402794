#!/bin/bash
# The expected answer is recomputed from the verifier's own copy of users.json.
mkdir -p /logs/verifier
if python3 -I /tests/check_admins.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
