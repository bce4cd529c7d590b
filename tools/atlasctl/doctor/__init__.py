"""`atlasctl doctor`: gather evidence from every serving node over SSH, then diagnose.

``inventory``  hosts and their SSH settings from ``ansible-inventory --list`` (host keys checked)
``gather``     one SSH round trip per host (OpenSSH, the inventory's settings), in parallel: the evidence sections
``checks``     pure functions, one per fault: Evidence -> [Finding]
``report``     text and JSON rendering, exit code
"""
