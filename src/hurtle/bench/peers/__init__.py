"""Task modules for each benchmarked system, imported only inside the worker and publisher
subprocesses (never by the driver), so that one peer's imports and patches touch no other."""
