"""clockq's settings, in parts by what they configure; clockq/settings.py reads them in order."""
