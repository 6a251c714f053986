#!/usr/bin/env bash
# Runs a command with TW_TMP set to a fresh temporary folder, and removes the
# folder afterwards, whatever the command's outcome.
set -u
TW_TMP=$(mktemp -d "${TMPDIR:-/tmp}/trainwatch-it.XXXXXX")
export TW_TMP
trap 'rm -rf "$TW_TMP"' EXIT
"$@"
