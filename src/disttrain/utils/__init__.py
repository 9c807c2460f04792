"""Small helpers every layer may use: garbage-collection control, neutral hook points, byte formatting,
ending a worker process. Imports nothing from disttrain but :mod:`disttrain.errors`."""
