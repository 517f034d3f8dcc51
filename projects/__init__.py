"""Experimental work kept outside the mmsoft package (as OpenMMLab repositories keep
theirs): each folder a package of its own, plugged in by import from the repository root
(``custom_imports=dict(imports=['projects.soft_lab'])``); mmsoft never imports it."""
