#!/bin/bash
# Builds a copy of the project with its Makefile, then judges the program on inputs made here.
mkdir -p /logs/verifier
if python3 -I /tests/check_build.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
