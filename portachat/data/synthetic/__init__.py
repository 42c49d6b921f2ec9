"""The built-in synthetic curriculum, en + zh: plain examples (curriculum.py, zh.py), the chat tasks
(tasks.py), the held-out rule (heldout.py) and pretraining documents (documents.py)."""
