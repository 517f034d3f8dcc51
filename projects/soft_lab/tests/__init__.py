"""The lab's tests: `python -m pytest projects/soft_lab/tests` from the repository root."""
