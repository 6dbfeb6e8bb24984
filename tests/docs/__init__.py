"""Tests of the documentation: the README walk, the docs' shape and their PromQL."""
