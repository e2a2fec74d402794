#!/bin/bash
# Reads a copy of the database; the view is also queried after rows are added to the copy.
mkdir -p /logs/verifier
if python3 -I /tests/check_sales.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
