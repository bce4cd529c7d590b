"""The lab behind `atlas-lab`: systemd-nspawn nodes on a private bridge, built from inventory/lab/lab.yml.

Public entry points live in :mod:`atlaslab.api`.
"""
