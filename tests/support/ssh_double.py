"""OpenSSH's client for a test: a shell script that runs the remote command on this machine."""

from __future__ import annotations

SSH_DOUBLE = """#!/bin/sh
# OpenSSH's client for a test: drop the options and the host, run the remote command on this machine.
while [ $# -gt 0 ]; do
    case "$1" in
        -o|-p|-i|-l|-F|-J) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
shift
exec sh -c "$*"
"""
