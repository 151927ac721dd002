"""Embedded data sets, loaders, tokenization and collation."""
