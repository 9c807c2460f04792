"""Distributed plumbing: process groups, the parallel layout, and strategies applied to a model."""
