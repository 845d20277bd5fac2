"""Analyses of trained federations: pure functions of masks, states and saved results."""
