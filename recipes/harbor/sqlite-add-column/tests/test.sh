#!/bin/bash
# Reads the migrated database read-only and compares it with the verifier's own copy of the rows.
mkdir -p /logs/verifier
if python3 -I /tests/check_migration.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
