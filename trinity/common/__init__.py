"""Shared building blocks: config, experiences, registries, workflows, rewards and models."""
