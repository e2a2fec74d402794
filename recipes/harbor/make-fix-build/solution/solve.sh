#!/bin/bash
set -euo pipefail
cd /app/wordstat
cat > Makefile <<'MK'
CC = gcc
CFLAGS = -O2 -Wall
OBJ = src/main.o src/stats.o
PREFIX ?= /usr/local

wordstat: $(OBJ)
	$(CC) $(CFLAGS) -o wordstat $(OBJ)

src/%.o: src/%.c src/stats.h
	$(CC) $(CFLAGS) -c $< -o $@

install: wordstat
	mkdir -p $(PREFIX)/bin
	cp wordstat $(PREFIX)/bin/wordstat

clean:
	rm -f wordstat src/*.o

.PHONY: install clean
MK
make
