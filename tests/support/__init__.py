"""Helpers, doubles and data builders the tests share; no tests here."""
