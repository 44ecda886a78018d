"""Tests of tae_driver: the engine's WAL driver, its cores and its local backends."""
