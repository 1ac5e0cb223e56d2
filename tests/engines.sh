#!/usr/bin/env bash
# Starts the engines the tests need (filled in by the docker work).
exit 0
