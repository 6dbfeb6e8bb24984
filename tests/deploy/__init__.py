"""Tests of what ships: alert rules, the Helm chart, the image, the dashboards."""
