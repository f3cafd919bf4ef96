"""The environment probe script; run as a file by the training interpreter, never imported by perfgate."""
