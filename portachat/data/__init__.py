"""Pretraining data: document sources (sources.py), the packing loader (loader.py), the synthetic
curriculum (synthetic.py) and Hub downloads (hub.py)."""
