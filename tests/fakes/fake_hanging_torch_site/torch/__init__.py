"""FAKE torch whose import never finishes: stands in for a hung driver or file system in perfgate's tests."""

import time

while True:
    time.sleep(3600)
