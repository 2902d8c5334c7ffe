"""`infersight eval`: run labelled fault scenarios live or from recordings, and score the detector on them."""
