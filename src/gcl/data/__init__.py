"""Data: raw sources, benchmark builders, batched augmentation."""
